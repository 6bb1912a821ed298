/* coldgroup.c - building, checking and mapping the cold segment groups'
 * filters (layout and rules in coldgroup.h).
 *
 * Why groups by id and not by count: ids are consecutive and segments
 * drop oldest first, so a group is a fixed range of ids, its filter is
 * complete once the newest id of the range goes cold, and which group a
 * segment is in needs no table: id / 16. Nothing else in the store
 * refers to a group, so a group without a filter (not built yet, not to
 * be trusted, no disk for it) only makes lookups of its keys ask each
 * segment, as they did before groups existed.
 *
 * Why built from the key indexes: they hold every key of the segment
 * (its 64 bits of hash), checked, sorted, 8 bytes each, where the
 * frames would cost a pass over the segment. */
#include "coldgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"

#define IDEM__CG_VERSION 4u
#define IDEM__CG_HDR 64u
#define IDEM__CG_BITS 16u  /* per key */

static const unsigned char idem__cg_magic[8] = "IDEMKGF";

/* Where a level's blocks begin: after the header and its members'
 * identities (a multiple of 64 bytes at both levels). */
static size_t idem__cg_body(unsigned lv)
{
    return IDEM__CG_HDR + (size_t)idem__cg_span(lv) * 32u;
}

static void idem__cg_name(char *buf, size_t n, unsigned lv, uint32_t num)
{
    snprintf(buf, n, lv ? "run-%08u.kgf" : "grp-%08u.kgf", num);
}

static uint64_t idem__cg_get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The cold segments of group num of level lv, segs[*lo, *hi) (ids are
 * consecutive from segs[0]); 1 if the group's newest id is among them
 * (complete). */
static int idem__cg_members(const idem__log *lg, unsigned lv, uint32_t num,
                            size_t *lo, size_t *hi)
{
    uint64_t first = (uint64_t)num * idem__cg_span(lv),
             last = first + idem__cg_span(lv);
    uint64_t base = lg->ncold ? lg->segs[0].id : 0;
    *lo = first > base ? (size_t)(first - base) : 0;
    *hi = last > base ? (size_t)(last - base) : 0;
    *lo = *lo < lg->ncold ? *lo : lg->ncold;
    int complete = *hi <= lg->ncold && *hi > *lo;
    *hi = *hi < lg->ncold ? *hi : lg->ncold;
    return complete;
}

/* Set the keys of cold index c in lane j of nstripes stripes. Loads of
 * blocks a few entries ahead overlap with the writes. */
static uint64_t idem__cg_set(uint64_t *blocks, uint64_t nstripes, unsigned j,
                             const idem__cold *c)
{
    enum { AHEAD = 16 };
    const uint64_t *h0s = c->h0s;
    uint64_t *lane = blocks + 2 * j;
    for (uint64_t i = 0; i < c->nents; i++) {
        if (i + AHEAD < c->nents)
            __builtin_prefetch(lane + 2 * IDEM__CG_LANES *
                                          idem__cg_stripe_of(nstripes,
                                                             h0s[i + AHEAD]),
                               1);
        uint64_t m[2], *blk = lane + 2 * IDEM__CG_LANES *
                                         idem__cg_stripe_of(nstripes, h0s[i]);
        idem__cg_mask(h0s[i], m);
        blk[0] |= m[0];
        blk[1] |= m[1];
    }
    return c->nents;
}

/* The stripes a filter of segs[lo, hi) at level lv needs: those of its
 * fullest lane; 0 when an index does not check out and cannot be built
 * again. */
static uint64_t idem__cg_stripes(idem__log *lg, unsigned lv, size_t lo,
                                 size_t hi)
{
    uint64_t keys[IDEM__CG_LANES] = {0}, most = 0;
    for (size_t i = lo; i < hi; i++) {
        if (idem__log_cold_sound(lg, &lg->segs[i]))
            return 0;
        unsigned j = idem__cg_lane(lg->segs[i].id, lv);
        keys[j] += lg->segs[i].cold->nents;
        most = keys[j] > most ? keys[j] : most;
    }
    uint64_t n = (most * IDEM__CG_BITS + 127) / 128;
    return n ? n : 1;
}

/* The file image of group num of level lv from segs[lo, hi) (heap, *len
 * bytes), or NULL without memory or when an index does not check out and
 * cannot be built again. */
static unsigned char *idem__cg_image(idem__log *lg, unsigned lv, uint32_t num,
                                     size_t lo, size_t hi, size_t *len)
{
    const size_t body = idem__cg_body(lv);
    uint64_t nstripes = idem__cg_stripes(lg, lv, lo, hi);
    if (!nstripes || nstripes > (SIZE_MAX - body) / 64 / IDEM__CG_STRIPE_LINES)
        return NULL;
    uint64_t nblocks = nstripes * IDEM__CG_STRIPE_LINES;  /* of 64 bytes */
    *len = body + (size_t)nblocks * 64;
    unsigned char *img = calloc(1, *len);
    if (!img)
        return NULL;
    uint64_t *blocks = (uint64_t *)(void *)(img + body), set = 0;
    for (size_t i = lo; i < hi; i++) {
        idem__cfseg id;
        idem__cfseg_of(&id, &lg->segs[i]);
        memcpy(img + IDEM__CG_HDR + (i - lo) * 32, &id, 32);
        set += idem__cg_set(blocks, nstripes,
                            idem__cg_lane(lg->segs[i].id, lv),
                            lg->segs[i].cold);
    }
    uint32_t version = IDEM__CG_VERSION;
    uint64_t v[5] = {hi - lo, nblocks, set,
                     XXH3_64bits(img + IDEM__CG_HDR, *len - IDEM__CG_HDR),
                     idem__cg_span(lv)};
    memcpy(img, idem__cg_magic, 8);
    memcpy(img + 8, &version, 4);
    memcpy(img + 12, &num, 4);
    memcpy(img + 16, v, sizeof v);
    uint64_t check = XXH3_64bits(img, 56);
    memcpy(img + 56, &check, 8);
    return img;
}

/* Do the blocks of img (mapped, len bytes) check out? */
static int idem__cg_body_sound(const unsigned char *img, size_t len)
{
    return idem__cg_get64(img + 40) ==
           idem__mapped_sum((void *)img, len, IDEM__CG_HDR);
}

/* Does img's header (len bytes in all) check out as that of the filter
 * of group num of level lv, and, unless lazy, its body too? */
static int idem__cg_sound(const unsigned char *img, size_t len, unsigned lv,
                          uint32_t num, int lazy)
{
    const size_t body = idem__cg_body(lv);
    uint32_t version, n;
    if (len < body + 64 || memcmp(img, idem__cg_magic, 8) != 0 ||
        idem__cg_get64(img + 56) != XXH3_64bits(img, 56))
        return 0;
    memcpy(&version, img + 8, 4);
    memcpy(&n, img + 12, 4);
    uint64_t members = idem__cg_get64(img + 16);
    uint64_t nblocks = idem__cg_get64(img + 24);
    return version == IDEM__CG_VERSION && n == num &&
           idem__cg_get64(img + 48) == idem__cg_span(lv) &&
           members <= idem__cg_span(lv) && nblocks &&
           nblocks % IDEM__CG_STRIPE_LINES == 0 &&
           nblocks == (len - body) / 64 && len == body + nblocks * 64 &&
           (lazy || idem__cg_body_sound(img, len));
}

/* Does img name every one of segs[lo, hi), as they are now? */
static int idem__cg_names(const idem__log *lg, const unsigned char *img,
                          size_t lo, size_t hi)
{
    uint64_t n = idem__cg_get64(img + 16);
    for (size_t i = lo; i < hi; i++) {
        idem__cfseg id;
        int named = 0;
        idem__cfseg_of(&id, &lg->segs[i]);
        for (uint64_t j = 0; j < n && !named; j++)
            named = memcmp(img + IDEM__CG_HDR + j * 32, &id, 32) == 0;
        if (!named)
            return 0;
    }
    return 1;
}

/* Group num's filter of level lv mapped (*img, *len) if it checks out
 * (lazy: its header only). 0 or -1. */
static int idem__cg_map(int dirfd, unsigned lv, uint32_t num, int lazy,
                        unsigned char **img, size_t *len)
{
    char name[32];
    struct stat st;
    idem__cg_name(name, sizeof name, lv, num);
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    void *p = fstat(fd, &st) == 0 && st.st_size > 0
                  ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd,
                         0)
                  : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED)
        return -1;
    /* Open reads the header and identities by themselves: around them
     * the kernel's read-ahead would read the whole file (1.1 GB of
     * group and run files at 3e8 keys). Held, it is read as usual
     * (idem__cg_hold). */
    madvise(p, (size_t)st.st_size, MADV_RANDOM);
    if (!idem__cg_sound(p, (size_t)st.st_size, lv, num, lazy)) {
        munmap(p, (size_t)st.st_size);
        return -1;
    }
    *img = p;
    *len = (size_t)st.st_size;
    return 0;
}

/* Is PATH/name a whole header of an older version's filter? A writer
 * builds it again at open: a layout left behind, not damage. */
static int idem__cg_older(int dirfd, const char *name)
{
    unsigned char h[IDEM__CG_HDR];
    uint32_t version;
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, h, sizeof h, 0) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)sizeof h || memcmp(h, idem__cg_magic, 8) != 0 ||
        idem__cg_get64(h + 56) != XXH3_64bits(h, 56))
        return 0;
    memcpy(&version, h + 8, 4);
    return version < IDEM__CG_VERSION;
}

int idem__cgroup_file_sound(int dirfd, unsigned lv, uint32_t num, char *name,
                            size_t n)
{
    unsigned char *img;
    size_t len;
    idem__cg_name(name, n, lv, num);
    if (faccessat(dirfd, name, F_OK, 0) != 0)
        return 1;
    if (idem__cg_map(dirfd, lv, num, 0, &img, &len) != 0)
        return idem__cg_older(dirfd, name);
    munmap(img, len);
    return 1;
}

/* The group num of level lv whose file is mapped at img (len bytes). */
static idem__cgroup idem__cg_of(unsigned lv, uint32_t num, unsigned char *img,
                                size_t len, int state)
{
    return (idem__cgroup){
        .num = num,
        .state = state,
        .img = img,
        .len = len,
        .blocks = (const uint64_t *)(void *)(img + idem__cg_body(lv)),
        .nblocks = idem__cg_get64(img + 24),
    };
}

/* Take the mapped filter of group num of level lv, newer than every
 * group of that level held. */
static int idem__cg_hold(idem__log *lg, unsigned lv, uint32_t num,
                         unsigned char *img, size_t len, int state)
{
    idem__cgroups *g = &lg->cg[lv];
    idem__cgroup *v = idem__grow(g->v, g->n, &g->cap, sizeof *v, 16);
    if (!v) {
        munmap(img, len);
        return -1;
    }
    g->v = v;
    v[g->n++] = idem__cg_of(lv, num, img, len, state);
    madvise(img, len, MADV_NORMAL);
    return 0;
}

/* Build group num's filter of level lv from segs[lo, hi), write it and
 * map it (*m, *len). 0 or -1. */
static int idem__cg_write(idem__log *lg, unsigned lv, uint32_t num, size_t lo,
                          size_t hi, unsigned char **m, size_t *len)
{
    char name[32];
    unsigned char *img = idem__cg_image(lg, lv, num, lo, hi, len);
    idem__cg_name(name, sizeof name, lv, num);
    int rc = img ? idem__dir_replace(lg->s, lg->dirfd, lg->dir, name, img,
                                     *len)
                 : -1;
    free(img);
    if (rc || idem__cg_map(lg->dirfd, lv, num, 0, m, len) != 0)
        return -1;
    lg->cg[lv].built++;
    return 0;
}

/* Build group num's filter of level lv from segs[lo, hi), newer than
 * every group of that level held, and hold it. */
static int idem__cg_make(idem__log *lg, unsigned lv, uint32_t num, size_t lo,
                         size_t hi)
{
    unsigned char *m;
    size_t len = 0;
    if (idem__cg_write(lg, lv, num, lo, hi, &m, &len) != 0)
        return -1;
    return idem__cg_hold(lg, lv, num, m, len, IDEM__CG_SOUND);
}

int idem__cgroup_usable(idem__log *lg, unsigned lv, idem__cgroup *q,
                        size_t lo, size_t hi)
{
    unsigned char *m;
    size_t len;
    if (q->state == IDEM__CG_UNCHECKED)
        q->state = idem__cg_body_sound(q->img, q->len) ? IDEM__CG_SOUND
                                                       : IDEM__CG_DAMAGED;
    if (q->state != IDEM__CG_DAMAGED)
        return 1;
    if (lg->readonly || idem__cg_write(lg, lv, q->num, lo, hi, &m, &len))
        return 0;
    munmap(q->img, q->len);
    *q = idem__cg_of(lv, q->num, m, len, IDEM__CG_SOUND);
    madvise(m, len, MADV_NORMAL);
    return 1;
}

/* Map group num's filter of level lv if it checks out and names its
 * members as they are; else build it again (never a reader's). */
static void idem__cg_take(idem__log *lg, unsigned lv, uint32_t num,
                          size_t lo, size_t hi)
{
    unsigned char *img;
    size_t len;
    if (idem__cg_map(lg->dirfd, lv, num, 1, &img, &len) == 0) {
        if (idem__cg_names(lg, img, lo, hi)) {
            (void)idem__cg_hold(lg, lv, num, img, len, IDEM__CG_UNCHECKED);
            return;
        }
        munmap(img, len);
    }
    if (!lg->readonly)
        (void)idem__cg_make(lg, lv, num, lo, hi);
}

void idem__cgroup_went_cold(idem__log *lg)
{
    size_t lo, hi;
    if (lg->memory || lg->dirfd < 0 || !lg->ncold)
        return;
    for (unsigned lv = 0; lv < IDEM__CG_LEVELS; lv++) {
        const idem__cgroups *g = &lg->cg[lv];
        uint32_t num = idem__cg_num(lg->segs[lg->ncold - 1].id, lv);
        if (idem__cg_members(lg, lv, num, &lo, &hi) &&
            (!g->n || g->v[g->n - 1].num < num))
            (void)idem__cg_make(lg, lv, num, lo, hi);
    }
}

void idem__cgroup_open(idem__log *lg)
{
    size_t lo, hi;
    if (lg->memory || lg->dirfd < 0 || !lg->ncold)
        return;
    for (unsigned lv = 0; lv < IDEM__CG_LEVELS; lv++)
        for (uint32_t num = idem__cg_num(lg->segs[0].id, lv);
             idem__cg_members(lg, lv, num, &lo, &hi); num++)
            idem__cg_take(lg, lv, num, lo, hi);
}

void idem__cgroup_gone(idem__log *lg, uint32_t id)
{
    for (unsigned lv = 0; lv < IDEM__CG_LEVELS; lv++) {
        idem__cgroups *g = &lg->cg[lv];
        uint32_t num = idem__cg_num(id, lv);
        if (lg->nsegs > 1 && idem__cg_num(lg->segs[1].id, lv) == num)
            continue;  /* others of its group are still there */
        if (g->n && g->v[0].num == num) {
            munmap(g->v[0].img, g->v[0].len);
            memmove(g->v, g->v + 1, (g->n - 1) * sizeof *g->v);
            g->n--;
        }
        char name[32];
        idem__cg_name(name, sizeof name, lv, num);
        /* Derived data: one left behind by a failure names segments that
         * are gone, and is never read again (ids only grow). */
        if (!lg->memory && !lg->readonly && lg->dirfd >= 0)
            (void)unlinkat(lg->dirfd, name, 0);
    }
}

size_t idem__cgroup_find(const idem__cgroups *g, uint32_t num)
{
    size_t lo = 0, hi = g->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->v[mid].num <= num)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void idem__cgroup_free(idem__cgroups *g)
{
    for (unsigned lv = 0; lv < IDEM__CG_LEVELS; lv++) {
        for (size_t i = 0; i < g[lv].n; i++)
            munmap(g[lv].v[i].img, g[lv].v[i].len);
        free(g[lv].v);
        memset(&g[lv], 0, sizeof g[lv]);
    }
}
