/* recover.c - reading a store back after a clean close or a crash.
 *
 * What a crash can leave: the newest segment ends in a torn or garbled
 * frame, or in whole frames never followed by a COMMIT (written by a
 * buffer flush or a commit whose fdatasync never returned). Neither was
 * ever reported durable, so both are cut. What a crash cannot leave is a
 * bad frame followed by good ones, or damage in an older segment: that is
 * the disk or someone else, and silently dropping committed records would
 * break the promise of exactly-once, so we stop and say where. `repair`
 * then keeps every frame that still checks out.
 *
 * Telling the two apart: a crash can only tear the group whose fdatasync
 * never returned, the last one. The disk may have kept any subset of its
 * sectors, so past a bad frame there may still be valid frames of that
 * group, up to and including its COMMIT, but never anything after that
 * COMMIT. A valid frame past a later COMMIT means committed data was
 * damaged; so does a first COMMIT past the damage whose group (a COMMIT
 * records where its group began) starts after the damage, as when the
 * damage hit the COMMIT of the group before. The scanner finds valid
 * frames past damage by trying every 4-byte boundary (frames are
 * 4-aligned); a checksum matching by chance in garbage has odds of 2^-32
 * (version 4) or 2^-64, once its version byte, kind and sizes matched. */
#include "recover.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dir.h"

/* What a scan of one segment found. */
typedef struct idem__scan {
    uint64_t commit_end;  /* just past the last COMMIT of the valid run */
    uint64_t bad_at;      /* where the valid run ends (== size: clean) */
    int midfile;          /* damage that a crash cannot explain */
    uint64_t records;     /* key frames in the valid run */
    int version;          /* the run ended at a frame of unknown version */
} idem__scan;

/* The first offset >= from (4-aligned) where a valid frame starts. */
static uint64_t idem__next_valid(const unsigned char *base, uint64_t size,
                                 uint64_t from)
{
    idem__frame f;
    uint64_t at = (from + IDEM__REC_ALIGN - 1) & ~(IDEM__REC_ALIGN - 1ull);
    for (; at + IDEM__REC_HDR <= size; at += IDEM__REC_ALIGN)
        if (idem__frame_decode(base + at, size - at, &f, 1) == 0)
            return at;
    return 0;
}

/* Damage at `at`: is a valid frame found past the first valid COMMIT
 * that follows it? (See the top of this file.) */
static int idem__damage_is_midfile(const unsigned char *base, uint64_t size,
                                   uint64_t at)
{
    idem__frame f;
    uint64_t p = idem__next_valid(base, size, at + IDEM__REC_ALIGN);
    while (p) {
        if (idem__frame_decode(base + p, size - p, &f, 1) != 0) {
            p = idem__next_valid(base, size, p + IDEM__REC_ALIGN);
            continue;
        }
        if (f.type == IDEM__R_COMMIT)
            return (uint64_t)f.rec.created > at ||
                   idem__next_valid(base, size, p + f.len) != 0;
        p += f.len;
    }
    return 0;
}

static void idem__scan_seg(const unsigned char *base, uint64_t size,
                           idem__scan *sc)
{
    memset(sc, 0, sizeof *sc);
    uint64_t at = IDEM__SEG_HDR;
    sc->commit_end = at;
    idem__frame f;
    while (at < size) {
        int rc = idem__frame_decode(base + at, size - at, &f, 1);
        if (rc) {
            sc->version = rc == IDEM_EVERSION;
            break;
        }
        at += f.len;
        if (f.type == IDEM__R_COMMIT)
            sc->commit_end = at;
        else
            sc->records++;
    }
    sc->bad_at = at < size ? at : size;
    if (at < size)
        sc->midfile = idem__damage_is_midfile(base, size, at);
}

static int idem__apply_range(const unsigned char *base, idem__seg *g,
                             uint64_t end, idem__apply_fn apply, void *ctx)
{
    idem__frame f[IDEM__APPLY_WINDOW];
    uint32_t off[IDEM__APPLY_WINDOW];
    size_t n = 0;
    for (uint64_t at = IDEM__SEG_HDR; at < end;) {
        if (idem__frame_decode(base + at, end - at, &f[n], 0))
            return IDEM_ECORRUPT;  /* verified by the scan: cannot happen */
        off[n] = (uint32_t)at;
        at += f[n].len;
        if (f[n].type != IDEM__R_COMMIT)
            n++;
        if (n == IDEM__APPLY_WINDOW || (at >= end && n)) {
            g->records += n;
            int rc = apply(ctx, g, off, f, n);
            if (rc)
                return rc;
            n = 0;
        }
    }
    return 0;
}

static int idem__seg_fail(idem__log *lg, int code, uint32_t id,
                          const char *what, uint64_t at, uint64_t size)
{
    char name[32];
    idem__seg_name(name, sizeof name, id);
    if (code == IDEM_EVERSION)  /* not damage: repair would drop it */
        return idem__fail(lg->s, code,
                          "%s/%s: %s at offset %llu of %llu; a newer idem "
                          "wrote it (this one reads segments up to "
                          "version %u and records up to version %u): open "
                          "the store with that idem",
                          lg->dir, name, what, (unsigned long long)at,
                          (unsigned long long)size, IDEM__SEG_VERSION,
                          IDEM__REC_VERSION);
    return idem__fail(lg->s, code,
                      "%s/%s: %s at offset %llu of %llu; "
                      "run `idem repair --store local:%s` to keep every "
                      "valid record",
                      lg->dir, name, what, (unsigned long long)at,
                      (unsigned long long)size, lg->dir);
}

/* What a segment header that idem__seg_header_ok refused with rc is. */
static const char *idem__header_what(int rc)
{
    return rc == IDEM_EVERSION ? "segment of a newer format"
                               : "bad segment header";
}

/* Open segment id and map it; read it all in now when whole (it is
 * about to be scanned), else only its header. */
static int idem__open_seg(idem__log *lg, uint32_t id, idem__seg *g,
                          int writable, int whole)
{
    char name[32];
    struct stat st;
    idem__seg_name(name, sizeof name, id);
    memset(g, 0, sizeof *g);
    g->id = id;
    g->fd = openat(lg->dirfd, name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (g->fd < 0 || fstat(g->fd, &st) != 0) {
        int rc = idem__log_ioerr(lg, "open", id, errno);
        if (g->fd >= 0)
            close(g->fd);
        return rc;
    }
    g->size = (uint64_t)st.st_size;
    g->dev = st.st_dev;
    g->ino = st.st_ino;
    if (g->size > UINT32_MAX) {
        close(g->fd);
        return idem__seg_fail(lg, IDEM_ECORRUPT, id, "segment too large",
                              g->size, g->size);
    }
    size_t need = whole ? (size_t)g->size : IDEM__SEG_HDR;
    int rc = idem__log_map(lg, g, need ? need : 1);
    if (rc) {
        close(g->fd);
        g->fd = -1;
    }
    return rc;
}

static void idem__close_seg(idem__seg *g)
{
    if (g->base)
        munmap(g->base, g->maplen);
    if (g->fd >= 0)
        close(g->fd);
}

/* Cut the newest segment back to its last commit. */
static int idem__cut_tail(idem__log *lg, idem__seg *g, uint64_t end)
{
    if (ftruncate(g->fd, (off_t)end) != 0 || fdatasync(g->fd) != 0)
        return idem__log_ioerr(lg, "truncate torn tail", g->id, errno);
    g->size = end;
    return 0;
}

/* How far into segment id (the newest file) the log had durably got:
 * what PATH/TAIL says for its last segment, else only the header. */
static uint64_t idem__durable_end(const idem__log *lg, uint32_t id)
{
    return lg->has_tail && id == lg->tail.last ? lg->tail.end
                                               : IDEM__SEG_HDR;
}

/* Has PATH/TAIL gone missing? A segment written by a store that keeps it
 * proves it existed once it holds a frame or a newer segment follows it
 * (see idem__seg_keeps_tail); a crash never deletes it, it is only ever
 * replaced by rename. Without this a deleted tail file would let damage at
 * the end of the log pass for a torn last group. */
static int idem__tail_lost(const idem__log *lg, const idem__seg *g,
                           int newest)
{
    return !lg->has_tail && (g->size > IDEM__SEG_HDR || !newest) &&
           idem__seg_keeps_tail(g->base, (size_t)g->size);
}

/* What a scan found that a crash cannot explain. */
typedef struct idem__verdict {
    int code;             /* 0: sound, or a torn tail to cut */
    const char *what;
    uint64_t at, of;      /* where, and the length it is measured against */
} idem__verdict;

/* Judge segment g from its scan. A sealed segment must be whole; the
 * newest must hold committed groups up to its durable end (a crash tears
 * only what follows) and past it may end in a torn group only. Open and
 * idem_check() both ask this, so they agree. */
static idem__verdict idem__judge(const idem__log *lg, const idem__seg *g,
                                 const idem__scan *sc, int newest)
{
    uint64_t durable = newest ? idem__durable_end(lg, g->id) : g->size;
    idem__verdict v = {IDEM_ECORRUPT, "damaged record", sc->bad_at, g->size};
    if (sc->version)
        v.code = IDEM_EVERSION, v.what = "record of a newer format";
    else if (idem__tail_lost(lg, g, newest))
        v.what = "TAIL is missing (this segment was written after it)",
        v.at = IDEM__SEG_HDR;
    else if (g->size < durable)
        v.what = "truncated", v.at = g->size, v.of = durable;
    else if (sc->bad_at < durable || (sc->bad_at < g->size && sc->midfile))
        ;  /* damaged record */
    else if (sc->commit_end < durable)
        v.what = newest ? "no commit where the log was sealed"
                        : "uncommitted records in a sealed segment",
        v.at = sc->commit_end;
    else
        v.code = 0;
    return v;
}

/* Check g's header and frames by the rules of idem__judge; *sc is what
 * the scan found. */
static int idem__verify_frames(idem__log *lg, idem__seg *g, int last,
                               idem__scan *sc)
{
    int rc = idem__seg_header_ok(g->base, (size_t)g->size, g->id,
                                 &g->created);
    if (rc)
        return idem__seg_fail(lg, rc, g->id, idem__header_what(rc), 0,
                              g->size);
    idem__scan_seg(g->base, g->size, sc);
    idem__verdict v = idem__judge(lg, g, sc, last);
    return v.code ? idem__seg_fail(lg, v.code, g->id, v.what, v.at, v.of)
                  : 0;
}

/* Open and verify one segment, cutting a torn tail if it is the newest;
 * on success it is lg's newest segment and *records its key frames. */
static int idem__verify_seg(idem__log *lg, uint32_t id, int last,
                            uint64_t *records)
{
    idem__seg g;
    int rc = idem__open_seg(lg, id, &g, last && !lg->readonly, 1);
    if (rc)
        return rc;
    idem__scan sc;
    rc = idem__verify_frames(lg, &g, last, &sc);
    if (!rc && last && sc.commit_end < g.size && lg->readonly)
        g.size = sc.commit_end;  /* ignore the tail, leave the file be */
    else if (!rc && last && sc.commit_end < g.size)
        rc = idem__cut_tail(lg, &g, sc.commit_end);
    if (!rc && last && lseek(g.fd, 0, SEEK_END) < 0)
        rc = idem__log_ioerr(lg, "seek", id, errno);
    if (rc) {
        idem__close_seg(&g);
        return rc;
    }
    g.committed = g.size;
    if (!last) {
        close(g.fd);
        g.fd = -1;
    }
    *records += sc.records;
    lg->segs[lg->nsegs++] = g;
    return 0;
}

/* Build the key index of sealed segment g again from its frames, which
 * are verified first, into c, and write it anew (not a reader). */
static int idem__kix_rebuild(idem__log *lg, idem__seg *g, idem__cold *c)
{
    idem__scan sc;
    int rc = idem__log_map(lg, g, (size_t)g->size);
    if (!rc)
        rc = idem__verify_frames(lg, g, 0, &sc);
    idem__segid sg = {g->id, g->size, g->created, g->base};
    if (!rc)
        rc = idem__cold_make(lg->s, lg->dirfd, lg->dir, &sg, lg->secret,
                             !lg->readonly, c);
    lg->kix_rebuilt += rc == 0;
    return rc;
}

/* The key index of sealed segment g: loaded from its file if its header
 * checks out and names g (its body is checked when first used, see
 * idem__log_cold_sound), else (never trusted) built again. */
static int idem__index_seg(idem__log *lg, idem__seg *g, idem__cold *c)
{
    idem__segid sg = {g->id, g->size, g->created, g->base};
    int rc = idem__cold_load(lg->dirfd, &sg, c, 1);
    if (rc != IDEM_ECORRUPT && rc != IDEM_ENOTFOUND)
        return rc == IDEM_ENOMEM ? idem__fail(lg->s, rc, "out of memory")
               : rc ? idem__log_ioerr(lg, "read key index", g->id, errno)
                    : 0;
    return idem__kix_rebuild(lg, g, c);
}

int idem__log_cold_sound(idem__log *lg, idem__seg *g)
{
    idem__cold *c = g->cold;
    if (!c->unchecked || (c->img && idem__cold_check(c)))
        return 0;
    idem__cold_free(c);
    int rc = idem__kix_rebuild(lg, g, c);
    if (rc) {
        /* Empty, and still to be checked: nothing of it is used, and
         * the next use tries again. */
        memset(c, 0, sizeof *c);
        c->unchecked = 1;
    }
    return rc;
}

/* Open a cold segment: its header and key index, not its frames. */
static int idem__load_cold(idem__log *lg, uint32_t id)
{
    idem__seg g;
    int rc = idem__open_seg(lg, id, &g, 0, 0);
    if (rc)
        return rc;
    if ((rc = idem__seg_header_ok(g.base, (size_t)g.size, id, &g.created)))
        rc = idem__seg_fail(lg, rc, id, idem__header_what(rc), 0, g.size);
    idem__log_map_read(&g);
    idem__cold *c = rc ? NULL : calloc(1, sizeof *c);
    if (!rc && !c)
        rc = idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
    if (!rc)
        rc = idem__index_seg(lg, &g, c);
    if (rc) {
        free(c);
        idem__close_seg(&g);
        return rc;
    }
    close(g.fd);
    g.fd = -1;
    g.committed = g.size;
    g.cold = c;
    g.records = c->records;
    g.max_expires = c->max_expires;
    g.live = c->nents;  /* at most; rewrites of its keys count it down */
    lg->segs[lg->nsegs++] = g;
    lg->ncold++;
    return 0;
}

/* How many of segments ids[from, n) are cold: up to the newest sealed one
 * with a key index file, since keys leave RAM oldest segment first. */
static size_t idem__cold_prefix(const idem__log *lg, const uint32_t *ids,
                                size_t from, size_t n)
{
    for (size_t i = n; i > from + 1; i--) {
        char name[32];
        idem__kix_name(name, sizeof name, ids[i - 2]);
        if (faccessat(lg->dirfd, name, F_OK, 0) == 0)
            return i - 1 - from;
    }
    return 0;
}

/* Was the newest segment being created when the process or the machine
 * died? Its header is written and synced before any frame, so it ends
 * within its header, or it is just a header that does not check out: a
 * power loss can make the file's size durable but not its bytes. Either
 * way it never held a record. A header of a newer version is not ours to
 * judge. */
static int idem__stillborn(idem__log *lg, uint32_t id)
{
    char name[32];
    unsigned char hdr[IDEM__SEG_HDR];
    struct stat st;
    int64_t created;
    idem__seg_name(name, sizeof name, id);
    int fd = openat(lg->dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;  /* opening it again reports why */
    ssize_t n = fstat(fd, &st) == 0 && st.st_size <= IDEM__SEG_HDR
                    ? pread(fd, hdr, sizeof hdr, 0)
                    : -1;
    close(fd);
    return n >= 0 && (n < (ssize_t)IDEM__SEG_HDR ||
                      idem__seg_header_ok(hdr, (size_t)n, id, &created) ==
                          IDEM_ECORRUPT);
}

/* Set aside segment file id: deleted (and the deletion made durable)
 * when fix, else only left out. */
static int idem__set_aside(idem__log *lg, uint32_t id, int fix)
{
    char name[32], kix[32];
    idem__seg_name(name, sizeof name, id);
    idem__kix_name(kix, sizeof kix, id);
    if (fix && ((unlinkat(lg->dirfd, kix, 0) != 0 && errno != ENOENT) ||
                unlinkat(lg->dirfd, name, 0) != 0 || fsync(lg->dirfd) != 0))
        return idem__log_ioerr(lg, "unlink", id, errno);
    return 0;
}

/* Is segment id's file gone from the directory? */
static int idem__seg_gone(idem__log *lg, uint32_t id)
{
    char name[32];
    idem__seg_name(name, sizeof name, id);
    return faccessat(lg->dirfd, name, F_OK, 0) != 0 && errno == ENOENT;
}

/* A reader that found segment id gone from under its walk, where no
 * writer's drop explains it (idem__dropped_under), while a repair holds
 * the store: renumbering the segments, it leaves such a gap for a
 * moment. That is no damage to report, nor to send anyone to repair.
 * Under a writer a segment gone is damage, and said so. */
static int idem__reader_cut(idem__log *lg, uint32_t id)
{
    char name[32];
    idem__seg_name(name, sizeof name, id);
    if (!lg->readonly || !idem__dir_repairing(lg->dirfd))
        return 0;
    return idem__fail(lg->s, IDEM_ELOCKED,
                      "%s/%s went missing while `idem repair` holds the "
                      "store, as it does for a moment while it renumbers "
                      "segments; open the store again once it is over",
                      lg->dir, name);
}

static int idem__missing(idem__log *lg, uint32_t id)
{
    char name[32];
    idem__seg_name(name, sizeof name, id);
    int cut = idem__reader_cut(lg, id);
    if (cut)
        return cut;
    return idem__fail(lg->s, IDEM_ECORRUPT,
                      "%s/%s is missing; run `idem repair --store local:%s` "
                      "to keep every valid record",
                      lg->dir, name, lg->dir);
}

/* Read PATH/TAIL into lg and fit the segment files ids[0, *n) to it.
 * Files older than its first were being dropped when a crash came; a
 * stillborn newest file past its last was being created: both are set
 * aside (see idem__set_aside), and [*from, *n) are the segments to read.
 * Returns IDEM_ECORRUPT, with the detail, when the tail is damaged or a
 * segment it names is missing (*from and *n are set all the same), or
 * another error that stops everything. */
static int idem__fit_tail(idem__log *lg, const uint32_t *ids, size_t *from,
                          size_t *n, int fix)
{
    int bad = idem__dir_tail_read(lg->s, lg->dirfd, lg->dir, &lg->tail);
    lg->has_tail = bad == 0;
    if (bad == IDEM_ENOTFOUND)
        bad = 0;
    if (bad && bad != IDEM_ECORRUPT)
        return bad;
    int rc = 0;
    *from = 0;
    while (!rc && lg->has_tail && *from < *n && ids[*from] < lg->tail.first)
        rc = idem__set_aside(lg, ids[(*from)++], fix);
    if (!rc && *n > *from &&
        (!lg->has_tail || ids[*n - 1] > lg->tail.last) &&
        idem__stillborn(lg, ids[*n - 1]))
        rc = idem__set_aside(lg, ids[--*n], fix);
    if (rc || bad || !lg->has_tail)
        return rc ? rc : bad;
    if (*n == *from || ids[*n - 1] < lg->tail.last)
        return idem__missing(lg, lg->tail.last);
    return ids[*from] != lg->tail.first ? idem__missing(lg, lg->tail.first)
                                        : 0;
}

/* A reader takes no lock: while it reads segments one by one, the writer
 * may drop the oldest ones (PATH/TAIL first, then the file). Was segment
 * id, which a reader failed to open, dropped so? Then so were all older
 * ones, every record in them had expired, and the reader's view starts
 * after it: a writer that drops segments faster than a reader reads them
 * cannot make the reader start over for ever. */
static int idem__dropped_under(idem__log *lg, uint32_t id)
{
    idem__tail now;
    return lg->readonly && idem__seg_gone(lg, id) &&
           idem__dir_tail_read(lg->s, lg->dirfd, lg->dir, &now) == 0 &&
           now.first > id;
}

/* A reader takes no lock, and `idem repair` may renumber the segments
 * after a lost one while the reader lists and reads them: it writes each
 * segment anew one id lower, then deletes the old file. A walk that met
 * it half way can have listed the old ids, then opened under a listed
 * name the file the repair wrote there since: one segment read twice,
 * the next never, and its keys, done, read as absent by a handle that
 * opened without an error. Hence this question once the walk is over:
 * is every segment it read still the file its name holds? If so, all
 * of them were in the directory at that one instant under the names
 * they were read by, and the directory holds every record at every
 * instant of a repair (a copy is written before its original goes, into
 * a name already emptied; ids without a gap then show at most one
 * segment twice, side by side, which reads as once). Inode numbers tell
 * files apart here because the reader still maps every segment it read:
 * none of theirs can go to another file meanwhile. A segment the writer
 * dropped is no cut (see idem__dropped_under), and a writer's rotation
 * gives no name to another file, so a reader racing it is not read again
 * for it. (Only a new segment whose tail file could not be written goes,
 * and its id comes again: a reader that read it reads again, once.) */
int idem__log_renumbered(idem__log *lg)
{
    for (size_t i = 0; i < lg->nsegs; i++) {
        const idem__seg *g = &lg->segs[i];
        char name[32];
        struct stat st;
        idem__seg_name(name, sizeof name, g->id);
        if (fstatat(lg->dirfd, name, &st, 0) == 0
                ? st.st_dev != g->dev || st.st_ino != g->ino
                : !idem__dropped_under(lg, g->id))
            return 1;
    }
    return 0;
}

/* A store opened for writing without PATH/TAIL (written by an earlier
 * idem, or a crash came between its first segment and its tail file) gets
 * one now, before any frame is appended; else a version-2 segment would
 * come to hold frames with no tail file, which open refuses as damage.
 * The newest segment was read from the page cache, which a crash of the
 * process alone leaves unsynced: it is synced before the tail file names
 * it durable. */
static int idem__adopt_tail(idem__log *lg)
{
    idem__seg *g = &lg->segs[lg->nsegs - 1];
    if (fdatasync(g->fd) != 0)
        return idem__log_ioerr(lg, "fdatasync", g->id, errno);
    int rc = idem__log_seal(lg);
    lg->has_tail = rc == 0;
    return rc;
}

int idem__recover(idem__log *lg, int64_t now, idem__apply_fn apply,
                  idem__reserve_fn reserve, void *ctx)
{
    uint32_t *ids;
    size_t n, from = 0;
    uint64_t records = 0;
    int rc = idem__dir_segments(lg->s, lg->dirfd, lg->dir, &ids, &n);
    if (rc)
        return rc;
    rc = idem__fit_tail(lg, ids, &from, &n, !lg->readonly);
    if (!rc && n > from) {
        lg->segs = calloc(n - from + 1, sizeof *lg->segs);
        lg->capsegs = n - from + 1;
        if (!lg->segs)
            rc = idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
    }
    size_t cold = rc ? 0 : idem__cold_prefix(lg, ids, from, n);
    for (size_t i = from; !rc && i < n; i++) {
        if (ids[i] != ids[from] + (i - from)) {
            rc = idem__missing(lg, ids[from] + (uint32_t)(i - from));
            break;
        }
        rc = i - from < cold ? idem__load_cold(lg, ids[i])
                             : idem__verify_seg(lg, ids[i], i + 1 == n,
                                                &records);
        if (rc && i + 1 < n && idem__dropped_under(lg, ids[i])) {
            idem__log_forget(lg);
            rc = 0;
        } else if (rc && idem__seg_gone(lg, ids[i])) {
            int cut = idem__reader_cut(lg, ids[i]);
            rc = cut ? cut : rc;
        }
    }
    free(ids);
    if (!rc) {
        idem__cfilter_open(lg);
        idem__cgroup_open(lg);
    }
    /* Everything checked out: now build the state, sized up front. */
    if (!rc && records)
        rc = reserve(ctx, records);
    for (size_t i = lg->ncold; !rc && i < lg->nsegs; i++) {
        idem__seg *g = &lg->segs[i];
        rc = idem__apply_range(g->base, g, g->size, apply, ctx);
    }
    if (!rc && lg->nsegs == 0 && !lg->readonly)
        rc = idem__log_new_segment(lg, now);
    else if (!rc && !lg->has_tail && !lg->readonly && !lg->memory)
        rc = idem__adopt_tail(lg);
    return rc;
}

/* ------------------------------------------------------------------------
 * check and repair: walk every valid frame, skipping damage. */

typedef int (*idem__salvage_fn)(void *ctx, const unsigned char *frame,
                                const idem__frame *f);

/* Visit every valid frame of base[HDR, size), counting damaged regions
 * and the bytes they cover. */
static int idem__salvage_walk(const unsigned char *base, uint64_t size,
                              idem_check_report *r, idem__salvage_fn fn,
                              void *ctx)
{
    uint64_t at = IDEM__SEG_HDR;
    idem__frame f;
    while (at < size) {
        if (idem__frame_decode(base + at, size - at, &f, 1) == 0) {
            r->records += f.type != IDEM__R_COMMIT;
            int rc = fn ? fn(ctx, base + at, &f) : 0;
            if (rc)
                return rc;
            at += f.len;
            continue;
        }
        uint64_t next = idem__next_valid(base, size, at + IDEM__REC_ALIGN);
        uint64_t end = next ? next : size;
        r->damaged++;
        r->bytes_lost += end - at;
        at = end;
    }
    return 0;
}

/* Where the run of valid frames from the header of base[HDR, size)
 * ends at a frame of a newer format (one that checks out but is of an
 * unknown version), or 0: what open refuses as newer. Not past damage:
 * there a frame that checks out may be bytes of a key or a value (a
 * client's, who can make them any frame at all), and a newer idem puts
 * no frame of its version in a segment of an older header version (it
 * starts a segment of its own), which the header check refuses. */
static uint64_t idem__newer_at(const unsigned char *base, uint64_t size)
{
    idem__frame f;
    uint64_t at = IDEM__SEG_HDR;
    while (at + IDEM__REC_HDR <= size) {
        int rc = idem__frame_decode(base + at, size - at, &f, 1);
        if (rc)
            return rc == IDEM_EVERSION ? at : 0;
        at += f.len;
    }
    return 0;
}

/* A segment, mapped whole, of a newer format than this build reads, or
 * holding a record of one, is not damage: check and repair refuse it
 * (IDEM_EVERSION, detail set) rather than count it or drop it. */
static int idem__refuse_newer(idem__log *lg, const idem__seg *g)
{
    int64_t created;
    if (idem__seg_header_ok(g->base, (size_t)g->size, g->id, &created) ==
        IDEM_EVERSION)
        return idem__seg_fail(lg, IDEM_EVERSION, g->id,
                              idem__header_what(IDEM_EVERSION), 0, g->size);
    uint64_t newer = idem__newer_at(g->base, g->size);
    return newer ? idem__seg_fail(lg, IDEM_EVERSION, g->id,
                                  "record of a newer format", newer, g->size)
                 : 0;
}

typedef struct idem__rewrite {
    idem__buf out;
    uint64_t commit_len;  /* out.len after the last COMMIT kept */
    const unsigned char *base;  /* the segment being read */
    uint64_t durable;     /* its frames before this offset were committed */
    uint64_t durable_len; /* out.len after the last of those kept */
} idem__rewrite;

static int idem__keep_frame(void *ctx, const unsigned char *frame,
                            const idem__frame *f)
{
    idem__rewrite *w = ctx;
    if (idem__buf_append(&w->out, frame, f->len))
        return IDEM_ENOMEM;
    if (f->type == IDEM__R_COMMIT)
        w->commit_len = w->out.len;
    if ((uint64_t)(frame - w->base) + f->len <= w->durable)
        w->durable_len = w->out.len;
    return 0;
}

/* Write segment id anew from w: temporary file, sync, rename. */
/* Write segment `id` anew from w (header included): temporary file,
 * sync, rename over the name for `id`. */
static int idem__replace_seg(idem__log *lg, uint32_t id, idem__rewrite *w)
{
    char name[32], tmp[40];
    idem__seg_name(name, sizeof name, id);
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    int fd = idem__dir_create(lg->dirfd, tmp, O_WRONLY | O_TRUNC);
    if (fd < 0)
        return idem__log_ioerr(lg, "create", id, errno);
    size_t len = (size_t)w->commit_len;
    int ok = write(fd, w->out.data, len) == (ssize_t)len && fsync(fd) == 0;
    int err = errno;
    close(fd);
    if (!ok || renameat(lg->dirfd, tmp, lg->dirfd, name) != 0 ||
        fsync(lg->dirfd) != 0)
        return idem__log_ioerr(lg, "rewrite", id, ok ? errno : err);
    return 0;
}

/* Is the header of g sound and does it carry the id g should have? */
static int idem__header_sound(const idem__seg *g, uint32_t want_id)
{
    int64_t created;
    return g->id == want_id &&
           idem__seg_header_ok(g->base, (size_t)g->size, g->id, &created) == 0;
}

/* End what w keeps with a COMMIT if its last committed frames lost
 * theirs: they were durable all the same. 0 or IDEM_ENOMEM. */
static int idem__seal_rewrite(idem__rewrite *w)
{
    if (w->durable_len <= w->commit_len)
        return 0;
    idem__rec none = {0};
    idem__fplan fp;
    size_t n = idem__frame_plan(&fp, IDEM__R_COMMIT, &none, NULL, 0, NULL, 0);
    w->out.len = (size_t)w->durable_len;
    if (idem__buf_reserve(&w->out, n))
        return IDEM_ENOMEM;
    idem__frame_write(w->out.data + w->out.len, &fp);
    w->out.len += n;
    w->commit_len = w->out.len;
    return 0;
}

/* Repair one segment if it needs it, giving it id want_id (closing a gap
 * left by a lost segment file). Every valid frame that was committed is
 * kept: in an older segment all of them, in the newest those before its
 * durable end or followed by a valid COMMIT (the rest were never durable);
 * a COMMIT ends what is kept. */
static int idem__repair_seg(idem__log *lg, idem__seg *g, uint32_t want_id,
                            int last, idem_check_report *r)
{
    idem_check_report mine = {0};
    idem__rewrite w = {.base = g->base,
                       .durable = last ? idem__durable_end(lg, g->id)
                                       : g->size};
    int64_t created;
    int hdr = idem__refuse_newer(lg, g);
    if (hdr)
        return hdr;
    hdr = idem__seg_header_ok(g->base, (size_t)g->size, g->id, &created);
    /* A header that does not check out is written anew; its time bucket
     * is unknown, so it counts as long over. */
    unsigned char fresh[IDEM__SEG_HDR];
    idem__seg_header(fresh, want_id, hdr ? 0 : created);
    int rc = idem__buf_append(&w.out, fresh, sizeof fresh)
                 ? IDEM_ENOMEM
                 : idem__salvage_walk(g->base, g->size, &mine,
                                      idem__keep_frame, &w);
    /* What the newest segment held past its committed frames was never
     * durable: it is dropped and counted as lost. */
    uint64_t kept = w.commit_len > w.durable_len ? w.commit_len
                                                 : w.durable_len;
    kept = kept > IDEM__SEG_HDR ? kept : IDEM__SEG_HDR;
    uint64_t uncommitted = rc ? 0 : w.out.len - kept;
    if (!rc)
        rc = idem__seal_rewrite(&w);
    if (!w.commit_len)
        w.commit_len = IDEM__SEG_HDR;
    int sound = idem__header_sound(g, want_id);
    if (!rc && (mine.damaged || !sound || w.commit_len != g->size))
        rc = idem__replace_seg(lg, want_id, &w);
    if (!rc && g->id != want_id) {
        char old[32];
        idem__seg_name(old, sizeof old, g->id);
        if (unlinkat(lg->dirfd, old, 0) != 0 || fsync(lg->dirfd) != 0)
            rc = idem__log_ioerr(lg, "unlink", g->id, errno);
    }
    if (rc == IDEM_ENOMEM)
        idem__fail(lg->s, rc, "out of memory");
    r->records += mine.records;
    r->damaged += mine.damaged + !sound;
    r->bytes_lost += mine.bytes_lost + uncommitted;
    idem__buf_free(&w.out);
    return rc;
}

static void idem__note_damage(idem__log *lg, idem_check_report *r,
                              uint32_t id, const char *what, uint64_t at)
{
    if (!r->first_damage[0])
        snprintf(r->first_damage, sizeof r->first_damage,
                 "%.120s/seg-%08u.log: %s at offset %llu", lg->dir, id, what,
                 (unsigned long long)at);
}

static int idem__check_seg(idem__log *lg, idem__seg *g, uint32_t want_id,
                           int last, idem_check_report *r)
{
    idem__scan sc;
    idem_check_report mine = {0};
    int64_t created;
    int rc = idem__refuse_newer(lg, g);
    if (rc)
        return rc;
    if (g->id != want_id) {
        r->damaged++;
        if (!r->first_damage[0])
            snprintf(r->first_damage, sizeof r->first_damage,
                     "%.120s/seg-%08u.log is missing", lg->dir, want_id);
    } else if (idem__seg_header_ok(g->base, (size_t)g->size, g->id,
                                   &created)) {
        r->damaged++;
        idem__note_damage(lg, r, g->id, "bad segment header", 0);
    }
    idem__scan_seg(g->base, g->size, &sc);
    idem__salvage_walk(g->base, g->size, &mine, NULL, NULL);
    r->records += mine.records;
    idem__verdict v = idem__judge(lg, g, &sc, last);
    if (v.code) {
        r->damaged += mine.damaged ? mine.damaged : 1;
        r->bytes_lost += mine.bytes_lost;
        idem__note_damage(lg, r, g->id, v.what, v.at);
    }
    return 0;
}

typedef int (*idem__seg_fn)(idem__log *lg, idem__seg *g, uint32_t want_id,
                            int last, idem_check_report *r);

static int idem__repair_derived(idem__log *lg, int64_t last);

/* The identity file: check reports damage; repair writes a new one with
 * a new secret for the keys' hash, which the segments do not depend on,
 * but their key indexes and filters do. */
static int idem__check_meta(idem__log *lg, int repair, idem_check_report *r)
{
    unsigned char secret[IDEM__SECRET_LEN];
    int rc = idem__dir_secret(lg->s, lg->dirfd, lg->dir, 1, secret);
    if (rc == 0 || (rc != IDEM_ECORRUPT && rc != IDEM_ENOTFOUND))
        return rc;
    r->damaged++;
    if (!r->first_damage[0])
        snprintf(r->first_damage, sizeof r->first_damage, "%.250s",
                 lg->s->detail);
    if (!repair)
        return 0;
    /* The key indexes and filters hold hashes under the secret that is
     * lost: they go before a new one is written. */
    rc = idem__repair_derived(lg, -1);
    return rc ? rc : idem__dir_meta_create(lg->s, lg->dirfd, lg->dir, secret);
}

/* Delete PATH/name, if it is there, and make that durable. */
static int idem__unlink_synced(idem__log *lg, const char *name)
{
    if (unlinkat(lg->dirfd, name, 0) != 0 && errno != ENOENT)
        return idem__fail(lg->s, IDEM_EIO, "%s/%s: %s", lg->dir, name,
                          strerror(errno));
    if (fsync(lg->dirfd) != 0)
        return idem__fail(lg->s, IDEM_EIO, "%s: fsync: %s", lg->dir,
                          strerror(errno));
    return 0;
}

/* After a repair, PATH/TAIL names the segments first.. (count of them)
 * as they now are, or goes when there are none. */
static int idem__repair_tail(idem__log *lg, uint32_t first, size_t count)
{
    if (!count)
        return idem__unlink_synced(lg, IDEM__TAIL);
    char name[32];
    struct stat st;
    idem__tail t = {.first = first, .last = first + (uint32_t)count - 1};
    idem__seg_name(name, sizeof name, t.last);
    if (fstatat(lg->dirfd, name, &st, 0) != 0)
        return idem__log_ioerr(lg, "stat", t.last, errno);
    t.end = (uint64_t)st.st_size;
    return idem__dir_tail_write(lg->s, lg->dirfd, lg->dir, &t);
}

/* PATH/name, derived data, does not check out: count it as damage (open
 * would build it again); repair deletes it, and open builds it again. */
static int idem__derived_damage(idem__log *lg, const char *name, int repair,
                                idem_check_report *r, const char *why)
{
    if (repair && (unlinkat(lg->dirfd, name, 0) != 0 || fsync(lg->dirfd)))
        return idem__fail(lg->s, IDEM_EIO, "%s/%s: %s", lg->dir, name,
                          strerror(errno));
    r->damaged++;
    if (!r->first_damage[0])
        snprintf(r->first_damage, sizeof r->first_damage, "%.120s/%s: %s",
                 lg->dir, name, why);
    return 0;
}

/* Segment id's key index, if it has one: does it check out whole, and
 * was it built from the segment as it is? Check counts one that does not
 * as damage (open would build it again); repair deletes it, and open
 * builds it again from the repaired segment. */
static int idem__check_kix(idem__log *lg, uint32_t id, int repair,
                           idem_check_report *r)
{
    char name[32];
    idem__kix_name(name, sizeof name, id);
    if (faccessat(lg->dirfd, name, F_OK, 0) != 0)
        return 0;
    idem__seg g;
    idem__cold c;
    int rc = idem__open_seg(lg, id, &g, 0, 0);
    if (rc)
        return rc;
    idem__segid sg = {id, g.size, 0, g.base};
    int sound = idem__seg_header_ok(g.base, (size_t)g.size, id,
                                    &sg.created) == 0 &&
                idem__cold_load(lg->dirfd, &sg, &c, 0) == 0;
    idem__close_seg(&g);
    if (sound)
        idem__cold_free(&c);
    return sound ? 0
                 : idem__derived_damage(lg, name, repair, r,
                                        "the key index does not check out "
                                        "(open builds it again from its "
                                        "segment)");
}

/* PATH/COLD, the filter in front of the cold segments, if there is one:
 * as a key index, derived data that open builds again. */
static int idem__check_cold(idem__log *lg, int repair, idem_check_report *r)
{
    return idem__cfilter_file_sound(lg->dirfd)
               ? 0
               : idem__derived_damage(lg, IDEM__COLD_FILE, repair, r,
                                      "the cold keys' filter does not check "
                                      "out (open builds it again from the "
                                      "key indexes)");
}

/* The filter of segment group num of level lv (coldgroup.h), if there
 * is one: as a key index, derived data that open builds again. */
static int idem__check_group(idem__log *lg, unsigned lv, uint32_t num,
                             int repair, idem_check_report *r)
{
    char name[32];
    return idem__cgroup_file_sound(lg->dirfd, lv, num, name, sizeof name)
               ? 0
               : idem__derived_damage(lg, name, repair, r,
                                      "the segment group's filter does not "
                                      "check out (open builds it again from "
                                      "the key indexes)");
}

/* Delete PATH/name if it is there. */
static int idem__unlink_derived(idem__log *lg, const char *name)
{
    if (unlinkat(lg->dirfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    return idem__fail(lg->s, IDEM_EIO, "%s/%s: %s", lg->dir, name,
                      strerror(errno));
}

/* Delete the files named PREFIX + number + SUFFIX numbered past keep
 * (-1: all of them). */
static int idem__drop_listed(idem__log *lg, const char *prefix,
                             const char *suffix, int64_t keep)
{
    uint32_t *ids;
    size_t n;
    int rc = idem__dir_ids(lg->s, lg->dirfd, lg->dir, prefix, suffix, &ids,
                           &n);
    for (size_t i = 0; !rc && i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s%08u%s", prefix, ids[i], suffix);
        if ((int64_t)ids[i] > keep)
            rc = idem__unlink_derived(lg, name);
    }
    free(ids);
    return rc;
}

/* Before a repair changes anything, what was derived from the segments
 * and may no longer be theirs goes, durably: PATH/COLD and the group and
 * run filters (open builds them again from the key indexes: 36 s at 3e8),
 * and the key indexes of segments numbered past last (-1: all of them,
 * when the keys' hash secret is new). They name a segment by id, size
 * and time bucket, and a segment that a repair renames, or a new one
 * numbered as a lost one was, can be as large and as old as the one they
 * were built from: they would pass for its own, and a lookup that
 * searched the wrong index would answer a DONE key as new. */
static int idem__repair_derived(idem__log *lg, int64_t last)
{
    int rc = idem__unlink_derived(lg, IDEM__COLD_FILE);
    if (!rc)
        rc = idem__drop_listed(lg, "grp-", ".kgf", -1);
    if (!rc)
        rc = idem__drop_listed(lg, "run-", ".kgf", -1);
    if (!rc)
        rc = idem__drop_listed(lg, "seg-", ".kix", last);
    if (!rc && fsync(lg->dirfd) != 0)
        rc = idem__fail(lg->s, IDEM_EIO, "%s: fsync: %s", lg->dir,
                        strerror(errno));
    return rc;
}

/* A repair is about to rename a segment to id want: the key index of the
 * segment that had that id goes first, durably (a crash between the two
 * would leave it beside a segment it could pass for). */
static int idem__repair_rename(idem__log *lg, uint32_t want)
{
    char name[32];
    idem__kix_name(name, sizeof name, want);
    return idem__unlink_synced(lg, name);
}

/* Check the key index and group filters derived from segment id. */
static int idem__check_derived(idem__log *lg, uint32_t id, int first,
                               int repair, idem_check_report *r)
{
    int rc = idem__check_kix(lg, id, repair, r);
    for (unsigned lv = 0; lv < IDEM__CG_LEVELS; lv++)
        if (!rc && (first || id % idem__cg_span(lv) == 0))
            rc = idem__check_group(lg, lv, idem__cg_num(id, lv), repair, r);
    return rc;
}

/* Refuse, before a repair changes anything (idem__local_check), a store
 * with a segment of a newer format than this build reads: its headers
 * alone say so. */
static int idem__newer_headers(idem__log *lg, const uint32_t *ids,
                               size_t from, size_t n)
{
    int rc = 0;
    for (size_t i = from; !rc && i < n; i++) {
        idem__seg g;
        int64_t created;
        rc = idem__open_seg(lg, ids[i], &g, 0, 0);
        if (!rc && g.size >= IDEM__SEG_HDR &&
            idem__seg_header_ok(g.base, IDEM__SEG_HDR, g.id, &created) ==
                IDEM_EVERSION)
            rc = idem__seg_fail(lg, IDEM_EVERSION, g.id,
                                idem__header_what(IDEM_EVERSION), 0, g.size);
        if (g.base)
            idem__close_seg(&g);
    }
    return rc;
}

/* Run fn on segments ids[from, n) of lg's directory, and check (or
 * repair) what is derived from them. A repair gives them the ids
 * ids[from], ids[from] + 1, ... (closing gaps). */
static int idem__visit_segs(idem__log *lg, const uint32_t *ids, size_t from,
                            size_t n, idem__seg_fn fn, int repair,
                            idem_check_report *r)
{
    int64_t last = n > from ? (int64_t)ids[from] + (int64_t)(n - from) - 1
                            : -1;
    int rc = repair ? idem__repair_derived(lg, last) : 0;
    for (size_t i = from; !rc && i < n; i++) {
        idem__seg g;
        uint32_t want = ids[from] + (uint32_t)(i - from);
        int moved = repair && want != ids[i];
        rc = moved ? idem__repair_rename(lg, want) : 0;
        if (!rc)
            rc = idem__open_seg(lg, ids[i], &g, repair, 1);
        if (!rc) {
            r->segments++;
            rc = fn(lg, &g, want, i + 1 == n, r);
            idem__close_seg(&g);
        }
        if (!rc && !moved)
            rc = idem__check_derived(lg, ids[i], i == from, repair, r);
    }
    if (!rc && repair)
        rc = idem__repair_tail(lg, n > from ? ids[from] : 0, n - from);
    return rc;
}

int idem__local_check(idem_store *s, const char *rest, int repair,
                      idem_check_report *r)
{
    idem__seg_fn fn = repair ? idem__repair_seg : idem__check_seg;
    idem__log lg = {.s = s, .dirfd = -1, .segment_bytes = 1};
    int lockfd = -1;
    uint32_t *ids = NULL;
    size_t from = 0, n = 0;
    unsigned how = IDEM__DIR_NOCREATE | (repair ? IDEM__DIR_REPAIR : 0u);
    int rc = idem__dir_uri(s, rest, &lg.dir, &how, NULL);
    if (!rc)
        rc = idem__dir_open(s, lg.dir, how, &lg.dirfd, &lockfd);
    if (!rc)
        rc = idem__dir_segments(s, lg.dirfd, lg.dir, &ids, &n);
    /* A repair refuses a segment of a newer format before it changes
     * any file, the identity file included. */
    if (!rc && repair)
        rc = idem__newer_headers(&lg, ids, 0, n);
    if (!rc)
        rc = idem__check_meta(&lg, repair, r);
    /* What a crash leaves while a segment is created or dropped is no
     * damage: open sets it aside, and so does repair. What the tail names
     * and is gone is damage; repair writes the tail anew. */
    if (!rc && (rc = idem__fit_tail(&lg, ids, &from, &n, repair)) ==
                   IDEM_ECORRUPT) {
        r->damaged++;
        if (!r->first_damage[0])
            snprintf(r->first_damage, sizeof r->first_damage, "%.250s",
                     s->detail);
        rc = 0;
    }
    if (!rc)
        rc = idem__visit_segs(&lg, ids, from, n, fn, repair, r);
    if (!rc)
        rc = idem__check_cold(&lg, repair, r);
    if (rc && !r->first_damage[0])
        snprintf(r->first_damage, sizeof r->first_damage, "%.250s",
                 s->detail);
    free(ids);
    if (lockfd >= 0)
        close(lockfd);
    idem__log_close(&lg);
    if (!rc && !repair && r->damaged)
        rc = IDEM_ECORRUPT;
    return rc;
}
