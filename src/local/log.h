/* log.h - segment files, the append buffer and group commit.
 *
 * The log is a run of segments with consecutive ids, oldest first; the
 * last one is active and takes appends. Frames are appended to a buffer
 * and reach the file when the buffer is large or at commit; a commit
 * appends a COMMIT frame, writes everything and calls fdatasync once.
 * Recovery applies only frames followed by a COMMIT, so each commit is
 * atomic: a batch and its checkpoint land together or not at all.
 *
 * A `mem:` store uses the same log with heap buffers for segments and no
 * files, so both backends share every rule.
 *
 * Invariants:
 *  - segment ids run from segs[0].id to segs[nsegs-1].id without gaps;
 *    only the oldest segment is ever dropped;
 *  - a segment other than the active one ends with a COMMIT frame, or
 *    holds no frame at all (it was started for an append that a crash or
 *    an error kept from committing): new segments are started only
 *    between commits;
 *  - bytes [0, size) of a segment are in its file (or heap buffer); bytes
 *    [size, size + wbuf.len) of the active segment are in wbuf;
 *  - after a failed write or sync `broken` is set and stays set: the
 *    memory state may be ahead of the disk;
 *  - PATH/TAIL (dir.h) never names more than is durable: it is written
 *    after a new segment's header is synced, before an old segment is
 *    unlinked, and at a clean close after the last commit. */
#ifndef IDEM_LOG_H
#define IDEM_LOG_H

#include <pthread.h>
#include <sys/types.h>

#include "cold.h"
#include "coldfilter.h"
#include "coldgroup.h"
#include "coldjob.h"
#include "common.h"
#include "dir.h"
#include "store.h"

/* magic 8, version 4, id 4, created 8, XXH3-64 8 (docs/internals.md) */
#define IDEM__SEG_HDR 32u
_Static_assert(IDEM__SEG_HDR == 8 + 4 + 4 + 8 + 8,
               "a segment header is 32 bytes");

typedef struct idem__seg {
    uint32_t id;
    int fd;                 /* -1 when closed or in memory */
    unsigned char *base;    /* mmap of the file, or the heap buffer */
    size_t maplen;          /* bytes mapped / allocated at base */
    uint64_t size;          /* bytes in the file / heap buffer */
    uint64_t committed;     /* size at the last commit */
    int64_t created;        /* ms: start of the segment's time bucket */
    int64_t max_expires;    /* newest expiry of any record written here */
    uint64_t live;          /* index entries pointing into it */
    uint64_t records;       /* key frames in it */
    idem__cold *cold;       /* its keys left RAM: their index (cold.h) */
    dev_t dev;              /* the file opened at recovery, which a */
    ino_t ino;              /* reader checks its name still holds */
} idem__seg;

typedef struct idem__log {
    idem_store *s;          /* for error details */
    int memory;             /* mem: heap segments, no files */
    int dirfd;              /* local: the store directory */
    char *dir;
    idem__seg *segs;
    size_t nsegs, capsegs;
    idem__buf wbuf;
    int in_group;           /* frames appended since the last commit */
    int broken;             /* 0, or the error that broke the log */
    int readonly;           /* IDEM_O_READONLY: never write or cut */
    int has_tail;           /* PATH/TAIL was read at open into tail */
    idem__tail tail;
    uint64_t segment_bytes;
    int64_t segment_span_ms;
    size_t ncold;           /* segs[0, ncold) are cold, the rest hot */
    idem__cfilter cf;       /* in front of the cold segments' filters */
    idem__cgroups cg[IDEM__CG_LEVELS]; /* filters of groups, of runs */
    uint64_t kix_rebuilt;   /* key indexes built again at open */
    const unsigned char *secret;  /* the store's key hash secret */
    /* A commit whose fdatasync runs on a thread of its own
     * (idem__log_commit_start): its segment, where its group ends, and
     * the result. Every later write waits for it first, so at most one
     * group on disk is ever not known durable, as with idem__log_commit;
     * `committed` moves when it is known durable. */
    int syncing;
    pthread_t syncer;
    int sync_fd, sync_err;
    uint32_t sync_seg;
    uint64_t sync_end;
    idem__coldjob job;      /* segs[ncold]'s key index, being built */
} idem__log;

/* Reserve room for an n-byte frame at the end of the log and return where
 * to encode it (*dst, valid until the next log call) and its location.
 * Starts a new segment first when the active one is full or its time
 * bucket is over and no commit is open. */
int idem__log_append(idem__log *lg, int64_t now, size_t n,
                     unsigned char **dst, uint32_t *seg, uint32_t *off);

/* Commit: append a COMMIT frame, write what is buffered, fdatasync.
 * No-op when nothing was appended since the last commit. */
int idem__log_commit(idem__log *lg);

/* The same, but the fdatasync runs on another thread and this returns
 * once the group is written: durable when idem__log_sync_wait() returns
 * 0. Without a thread for it, it syncs here. */
int idem__log_commit_start(idem__log *lg);

/* Wait for the fdatasync of a commit started before, if one runs. 0, or
 * its failure (which breaks the log). */
int idem__log_sync_wait(idem__log *lg);

/* A clean close: commit, then record in PATH/TAIL where the log ends, so
 * that the next open can tell loss from a torn tail. */
int idem__log_seal(idem__log *lg);

/* The segment with this id, or NULL if it was dropped. */
idem__seg *idem__log_seg(idem__log *lg, uint32_t id);

/* Point *p at the bytes at (seg, off) and *avail at how many are
 * readable there, valid until the next log call. 0; IDEM_ENOTFOUND if
 * the segment was dropped; IDEM_ECORRUPT if nothing was written there;
 * or the error that kept the segment from being mapped. */
int idem__log_at(idem__log *lg, uint32_t seg, uint32_t off,
                 const unsigned char **p, size_t *avail);

/* Start a new active segment whose bucket begins at now. */
int idem__log_new_segment(idem__log *lg, int64_t now);

/* Delete the oldest segment (never the active one), its key index
 * first if it has one, and a job building that index first of all. */
int idem__log_drop_oldest(idem__log *lg);

/* Map (more of) a file segment so that `need` bytes are readable. A
 * mapping of the header alone (a cold segment's, at open) reads only
 * the pages touched until idem__log_map_read(g) says it is to be read
 * as usual. */
int idem__log_map(idem__log *lg, idem__seg *g, size_t need);
void idem__log_map_read(idem__seg *g);

/* Cold segment g's key index checks out (it was loaded lazily, see
 * idem__cold_load): 0 once it does, whether as it was or built again
 * from g's frames; else why it could not be built (nothing of it may be
 * used then). Everything that reads an index's filter, entries or
 * checkpoints asks this first. */
int idem__log_cold_sound(idem__log *lg, idem__seg *g);

/* The file name of segment id: "seg-00000001.log". */
void idem__seg_name(char *buf, size_t n, uint32_t id);

/* Encode/check a segment header. Version 1: written before the store kept
 * PATH/TAIL. Version 2: the store keeps PATH/TAIL, and it is written before
 * the first frame of the segment, so a version-2 segment that holds a frame
 * (or is not the newest) proves that PATH/TAIL existed. Version 3: the same
 * as 2, but written by a build that writes version 4 frames, so that a
 * build before them refuses the segment as "of a newer format" rather than
 * as damage. Version 4: the same, by a build that writes version 5
 * frames. Every build reads the frames of every version in any
 * segment. */
#define IDEM__SEG_VERSION 4u
void idem__seg_header(unsigned char *dst, uint32_t id, int64_t created);
int idem__seg_header_ok(const unsigned char *p, size_t avail, uint32_t id,
                        int64_t *created);

/* Was the segment whose header is p written by a store that keeps
 * PATH/TAIL (version 2 or later)? Call after idem__seg_header_ok. */
int idem__seg_keeps_tail(const unsigned char *p, size_t avail);

/* Release the segments read so far (recovery: a reader that finds the
 * writer dropped the next one starts its view after it), once a job
 * that reads one is done. */
void idem__log_forget(idem__log *lg);

/* Release every segment and buffer (does not commit). */
void idem__log_close(idem__log *lg);

/* Record an I/O failure: errno to IDEM_EIO/ENOSPC, detail names the file
 * and the operation. */
int idem__log_ioerr(idem__log *lg, const char *op, uint32_t seg, int err);

/* Check the invariants above: 0, or IDEM_ECORRUPT and what is wrong in
 * why[0..n). For tests and debugging (log_check.c): the library never
 * calls it. */
int idem__log_check(idem__log *lg, char *why, size_t n);

/* The log of a local: or mem: store (engine.c); NULL on other backends. */
idem__log *idem__engine_log(idem_store *s);

#endif
