/* coldfilter.c - building, growing and keeping the filter in front of
 * the cold segments (layout and rules in coldfilter.h).
 *
 * Why rebuild rather than count or delete: segments drop whole and
 * oldest first, so a filter that forgets nothing only carries the bits
 * of keys that are gone, and rebuilding it when those make up a quarter
 * of it costs, spread over the keys that went cold since, a few inserts
 * a key (each a 16-byte read of an index entry and one cache line
 * written), against a probe per cold segment for every new key saved.
 *
 * Why anonymous memory and a file written at close, not a mapped file:
 * the filter changes with every segment that goes cold, and one written
 * in place would be half old, half new after a crash. A crash leaves
 * the file of the last clean close, whose segment list tells open which
 * keys to set again: nothing is trusted that the file does not say. */
#include "coldfilter.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"

#define IDEM__CF_VERSION 1u
#define IDEM__CF_HDR 72u
#define IDEM__CF_BITS 24u            /* per key of capacity */
#define IDEM__CF_MIN_CAP 65536u      /* keys: below this, not worth a build */

static const unsigned char idem__cf_magic[8] = "IDEMCFL";

void idem__cfilter_prefetch(const idem__cfilter *f, const uint64_t h[2])
{
    if (f->blocks)
        __builtin_prefetch(f->blocks + 8 * idem__cf_block(f->nblocks, h[0]));
}

static void idem__cf_unmap(idem__cfilter *f)
{
    if (f->blocks)
        munmap(f->blocks, (size_t)f->nblocks * 64);
    f->blocks = NULL;
    f->nblocks = 0;
    f->cap = 0;
    f->set = 0;
    f->nsegs = 0;
}

void idem__cfilter_free(idem__cfilter *f)
{
    idem__cf_unmap(f);
    free(f->segs);
    memset(f, 0, sizeof *f);
}

size_t idem__cfilter_bytes(const idem__cfilter *f)
{
    return f->blocks ? (size_t)f->nblocks * 64 : 0;
}

/* Zeroed, page-aligned room for a filter of cap keys. 0 or ENOMEM. */
static int idem__cf_map(idem__cfilter *f, uint64_t cap)
{
    uint64_t nblocks = (cap * IDEM__CF_BITS + 511) / 512;
    if (nblocks > SIZE_MAX / 64)
        return IDEM_ENOMEM;
    void *p = mmap(NULL, (size_t)nblocks * 64, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return IDEM_ENOMEM;
    f->blocks = p;
    f->nblocks = nblocks;
    f->cap = cap;
    f->set = 0;
    f->nsegs = 0;
    return 0;
}

static void idem__cf_id(idem__cfseg *id, const idem__seg *g)
{
    memset(id, 0, sizeof *id);
    id->id = g->id;
    id->size = g->size;
    id->created = g->created;
    id->body = g->cold->body;
}

/* Set the keys of cold segment g, and name it among those held. Loads of
 * blocks a few entries ahead overlap with the writes. */
static int idem__cf_set(idem__cfilter *f, const idem__seg *g)
{
    idem__cfseg *s = idem__grow(f->segs, f->nsegs, &f->capsegs, sizeof *s,
                                64);
    if (!s)
        return IDEM_ENOMEM;
    f->segs = s;
    idem__cf_id(&f->segs[f->nsegs++], g);
    const idem__kent *e = g->cold->ents;
    uint64_t n = g->cold->nents;
    enum { AHEAD = 16 };
    for (uint64_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            __builtin_prefetch(
                f->blocks + 8 * idem__cf_block(f->nblocks, e[i + AHEAD].h0),
                1);
        uint64_t m[8];
        idem__cf_mask(e[i].h0, e[i].h1, m);
        uint64_t *blk = f->blocks + 8 * idem__cf_block(f->nblocks, e[i].h0);
        for (unsigned w = 0; w < 8; w++)
            blk[w] |= m[w];
    }
    f->set += n;
    f->dirty = 1;
    return 0;
}

static uint64_t idem__cf_keys(const idem__log *lg)
{
    uint64_t n = 0;
    for (size_t i = 0; i < lg->ncold; i++)
        n += lg->segs[i].cold->nents;
    return n;
}

/* Build the filter again from every cold segment's index, with room for
 * a quarter more keys. The old one goes first (the peak stays one
 * filter); without memory for the new one, there is none, which is
 * slow, not wrong. */
static int idem__cf_build(idem__log *lg)
{
    idem__cfilter *f = &lg->cf;
    uint64_t keys = idem__cf_keys(lg);
    uint64_t cap = keys + keys / 4;
    idem__cf_unmap(f);
    f->serves = keys;
    f->dirty = 1;
    f->builds++;
    int rc = idem__cf_map(f, cap < IDEM__CF_MIN_CAP ? IDEM__CF_MIN_CAP : cap);
    for (size_t i = 0; !rc && i < lg->ncold; i++)
        rc = idem__cf_set(f, &lg->segs[i]);
    if (rc)
        idem__cf_unmap(f);
    return rc;
}

int idem__cfilter_add(idem__log *lg, size_t i)
{
    idem__cfilter *f = &lg->cf;
    const idem__cold *c = lg->segs[i].cold;
    if (!f->blocks || f->set + c->nents > f->cap)
        return idem__cf_build(lg);
    f->serves += c->nents;
    int rc = idem__cf_set(f, &lg->segs[i]);
    if (rc)
        idem__cf_unmap(f);
    return rc;
}

void idem__cfilter_gone(idem__cfilter *f, const idem__cold *c)
{
    f->serves -= c->nents < f->serves ? c->nents : f->serves;
}

int idem__cfilter_fit(idem__log *lg)
{
    idem__cfilter *f = &lg->cf;
    if (!lg->ncold) {
        if (f->blocks)
            f->dirty = 1;
        idem__cf_unmap(f);
        return 0;
    }
    if (f->blocks && f->cap > IDEM__CF_MIN_CAP && f->serves * 4 < f->cap * 3)
        return idem__cf_build(lg);
    return 0;
}

/* ------------------------------------------------------------------------
 * PATH/COLD */

static uint64_t idem__cf_get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint64_t idem__cf_secret_hash(const idem__log *lg)
{
    return XXH3_64bits(lg->secret, IDEM__SECRET_LEN);
}

/* Read len bytes at off whole. */
static int idem__cf_pread(int fd, void *buf, size_t len, off_t off)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len, off);
        if (r <= 0)
            return -1;
        p += r;
        len -= (size_t)r;
        off += r;
    }
    return 0;
}

/* The header's counts, if it checks out by itself and matches the file's
 * length. */
typedef struct idem__cfhdr {
    uint64_t secret, nblocks, cap, set, nsegs, body;
} idem__cfhdr;

static int idem__cf_header(const unsigned char *h, uint64_t len,
                           idem__cfhdr *o)
{
    uint32_t version, k;
    memcpy(&version, h + 8, 4);
    memcpy(&k, h + 12, 4);
    if (memcmp(h, idem__cf_magic, 8) != 0 || version != IDEM__CF_VERSION ||
        k != IDEM__CF_K || idem__cf_get64(h + 64) != XXH3_64bits(h, 64))
        return 0;
    o->secret = idem__cf_get64(h + 16);
    o->nblocks = idem__cf_get64(h + 24);
    o->cap = idem__cf_get64(h + 32);
    o->set = idem__cf_get64(h + 40);
    o->nsegs = idem__cf_get64(h + 48);
    o->body = idem__cf_get64(h + 56);
    return o->nblocks && o->nblocks < (1ull << 40) &&
           o->nsegs < (1ull << 32) &&
           len == IDEM__CF_HDR + o->nsegs * 32 + o->nblocks * 64;
}

/* Read the file into f (blocks, segments) if it checks out whole. 0, or
 * -1 (absent, damaged, another store's, unreadable, no memory). */
static int idem__cf_read(int fd, uint64_t secret, idem__cfilter *f)
{
    unsigned char h[IDEM__CF_HDR];
    struct stat st;
    idem__cfhdr o;
    if (fstat(fd, &st) != 0 || idem__cf_pread(fd, h, sizeof h, 0) != 0 ||
        !idem__cf_header(h, (uint64_t)st.st_size, &o) ||
        (secret && o.secret != secret))
        return -1;
    idem__cfseg *segs = malloc(o.nsegs ? o.nsegs * 32 : 1);
    if (!segs || idem__cf_map(f, o.cap) != 0 || f->nblocks != o.nblocks ||
        idem__cf_pread(fd, segs, o.nsegs * 32, IDEM__CF_HDR) != 0 ||
        idem__cf_pread(fd, f->blocks, o.nblocks * 64,
                       (off_t)(IDEM__CF_HDR + o.nsegs * 32)) != 0) {
        free(segs);
        idem__cf_unmap(f);
        return -1;
    }
    XXH3_state_t *x = XXH3_createState();
    int ok = x && XXH3_64bits_reset(x) == XXH_OK &&
             XXH3_64bits_update(x, segs, o.nsegs * 32) == XXH_OK &&
             XXH3_64bits_update(x, f->blocks, o.nblocks * 64) == XXH_OK &&
             XXH3_64bits_digest(x) == o.body;
    XXH3_freeState(x);
    if (!ok) {
        free(segs);
        idem__cf_unmap(f);
        return -1;
    }
    free(f->segs);
    f->segs = segs;
    f->nsegs = f->capsegs = (size_t)o.nsegs;
    f->set = o.set;
    return 0;
}

int idem__cfilter_file_sound(int dirfd)
{
    int fd = openat(dirfd, IDEM__COLD_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    idem__cfilter f = {0};
    int ok = idem__cf_read(fd, 0, &f) == 0;
    close(fd);
    idem__cfilter_free(&f);
    return ok;
}

static int idem__cf_holds(const idem__cfilter *f, const idem__seg *g)
{
    idem__cfseg id;
    idem__cf_id(&id, g);
    for (size_t i = 0; i < f->nsegs; i++)
        if (memcmp(&f->segs[i], &id, sizeof id) == 0)
            return 1;
    return 0;
}

/* The file's filter, with the keys of the cold segments it does not
 * name set; -1 when it cannot serve (none, damaged, too small). */
static int idem__cf_adopt(idem__log *lg)
{
    idem__cfilter *f = &lg->cf;
    int fd = openat(lg->dirfd, IDEM__COLD_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = idem__cf_read(fd, idem__cf_secret_hash(lg), f);
    close(fd);
    if (rc)
        return -1;
    size_t held = f->nsegs;
    uint64_t more = 0;
    for (size_t i = 0; i < lg->ncold; i++)
        if (!idem__cf_holds(f, &lg->segs[i]))
            more += lg->segs[i].cold->nents;
    if (f->set + more > f->cap)
        return -1;
    for (size_t i = 0; i < lg->ncold; i++)
        if (!idem__cf_holds(f, &lg->segs[i]) &&
            idem__cf_set(f, &lg->segs[i]) != 0)
            return -1;
    f->serves = idem__cf_keys(lg);
    f->dirty = f->nsegs != held;
    return 0;
}

void idem__cfilter_open(idem__log *lg)
{
    if (!lg->ncold)
        return;
    /* Without memory for it, lookups ask each segment's own filter. */
    if (idem__cf_adopt(lg) == 0)
        (void)idem__cfilter_fit(lg);
    else
        (void)idem__cf_build(lg);
}

int idem__cfilter_save(idem__log *lg)
{
    idem__cfilter *f = &lg->cf;
    if (!f->dirty || lg->readonly || lg->memory || lg->dirfd < 0)
        return 0;
    if (!f->blocks) {
        /* Nothing cold (or no memory for it): a file left would name
         * segments that may come back with other keys set. */
        if (unlinkat(lg->dirfd, IDEM__COLD_FILE, 0) != 0 && errno != ENOENT)
            return idem__fail(lg->s, IDEM_EIO, "%s/%s: %s", lg->dir,
                              IDEM__COLD_FILE, strerror(errno));
        f->dirty = 0;
        return 0;
    }
    unsigned char h[IDEM__CF_HDR] = {0};
    uint32_t version = IDEM__CF_VERSION, k = IDEM__CF_K;
    uint64_t v[6] = {idem__cf_secret_hash(lg), f->nblocks, f->cap, f->set,
                     f->nsegs, 0};
    XXH3_state_t *x = XXH3_createState();
    if (!x)
        return idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
    XXH3_64bits_reset(x);
    XXH3_64bits_update(x, f->segs, f->nsegs * 32);
    XXH3_64bits_update(x, f->blocks, f->nblocks * 64);
    v[5] = XXH3_64bits_digest(x);
    XXH3_freeState(x);
    memcpy(h, idem__cf_magic, 8);
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &k, 4);
    memcpy(h + 16, v, sizeof v);
    uint64_t check = XXH3_64bits(h, 64);
    memcpy(h + 64, &check, 8);
    struct iovec iov[3] = {{h, sizeof h},
                           {f->segs, f->nsegs * 32},
                           {f->blocks, (size_t)f->nblocks * 64}};
    int rc = idem__dir_replace_v(lg->s, lg->dirfd, lg->dir, IDEM__COLD_FILE,
                                 iov, 3);
    f->dirty = rc != 0;
    return rc;
}
