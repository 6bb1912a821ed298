/* cold.c - building, checking and searching a cold segment's key index.
 *
 * Why a file per segment: segments are the unit of expiry, so an index
 * that lives and dies with its segment never needs compaction or
 * merging: dropping an expired segment drops its index with it. Keys
 * leave RAM a whole segment at a time, oldest first, and a lookup that
 * misses RAM asks the cold segments newest first, so the first frame it
 * finds is the key's newest.
 *
 * Why a blocked Bloom filter: most claims are of new keys, which every
 * cold segment must be asked about; a probe that touches one cache line
 * (instead of k) keeps that cost at one memory access a segment, and
 * only a hit (true, or false at 5e-5) reads the sorted entries.
 *
 * Why rebuild instead of repair: everything here is derived from the
 * segment, whose frames carry their own checksums. A file that does not
 * check out whole, or that names another size or time bucket than the
 * segment beside it (a repair rewrote the segment), is built again from
 * the segment. */
#include "cold.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"
#include "record.h"

#define IDEM__KIX_VERSION 2u
#define IDEM__BLOOM_BITS 24u   /* per key: 5e-5 false positives at k 13 */
#define IDEM__BLOOM_K 13u

static const unsigned char idem__kix_magic[8] = "IDEMKIX";

void idem__kix_name(char *buf, size_t n, uint32_t id)
{
    snprintf(buf, n, "seg-%08u.kix", id);
}

/* The block of h: the high bits of h[1] scaled to nblocks. */
static uint64_t idem__block_of(uint64_t nblocks, const uint64_t h[2])
{
    return (uint64_t)(((unsigned __int128)h[1] * nblocks) >> 64);
}

/* The k bit positions of h inside its 512-bit block, 9 bits each, from
 * h[0] and a remix of both halves (h[1] chose the block). */
static void idem__bits_of(const uint64_t h[2], unsigned pos[IDEM__BLOOM_K])
{
    uint64_t a = h[0];
    uint64_t b = (h[0] ^ h[1]) * 0x9E3779B97F4A7C15ull;
    b ^= b >> 31;
    for (unsigned i = 0; i < IDEM__BLOOM_K; i++) {
        uint64_t *w = i < 7 ? &a : &b;
        pos[i] = (unsigned)(*w & 511u);
        *w >>= 9;
    }
}

void idem__probe_init(idem__probe *p, const uint64_t h[2])
{
    unsigned pos[IDEM__BLOOM_K];
    idem__bits_of(h, pos);
    memset(p, 0, sizeof *p);
    p->h[0] = h[0];
    p->h[1] = h[1];
    for (unsigned i = 0; i < IDEM__BLOOM_K; i++)
        p->mask[pos[i] >> 6] |= 1ull << (pos[i] & 63);
}

int idem__cold_has(const idem__cold *c, const idem__probe *p)
{
    const uint64_t *blk = c->blocks + 8 * idem__block_of(c->nblocks, p->h);
    uint64_t missing = 0;
    for (unsigned w = 0; w < 8; w++)
        missing |= p->mask[w] & ~blk[w];
    return missing == 0;
}

int idem__cold_maybe(const idem__cold *c, const uint64_t h[2])
{
    idem__probe p;
    idem__probe_init(&p, h);
    return idem__cold_has(c, &p);
}

void idem__cold_prefetch(const idem__cold *c, const uint64_t h[2])
{
    __builtin_prefetch(c->blocks + 8 * idem__block_of(c->nblocks, h));
}

static void idem__bloom_add(uint64_t *blocks, uint64_t nblocks,
                            const uint64_t h[2])
{
    uint64_t *blk = blocks + 8 * idem__block_of(nblocks, h);
    unsigned pos[IDEM__BLOOM_K];
    idem__bits_of(h, pos);
    for (unsigned i = 0; i < IDEM__BLOOM_K; i++)
        blk[pos[i] >> 6] |= 1ull << (pos[i] & 63);
}

/* The first of v[lo, hi) not below x (hi if none). */
static uint64_t idem__lower_in(const uint64_t *v, uint64_t lo, uint64_t hi,
                               uint64_t x)
{
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The hashes are uniform, so the entry a hash would have is about where
 * its value says (hash / 2^64 of the way in), off by a few hundred at 65 k
 * entries: a search that starts there, gallops out until it brackets the
 * answer and halves the bracket reads a page or two, where a binary
 * search over the whole index read a page a step for its first nine
 * (each a TLB miss on a mapped file). Any order of values still gets the
 * right answer: the guess only decides where the search starts. */
uint64_t idem__cold_lower(const idem__cold *c, const uint64_t h[2])
{
    const uint64_t *v = c->h0s, n = c->nents, x = h[0];
    if (n == 0)
        return 0;
    uint64_t at = (uint64_t)(((unsigned __int128)x * n) >> 64); /* < n */
    uint64_t lo, hi, step = 1;
    if (v[at] < x) {  /* the answer is past at */
        lo = at + 1;
        while (step < n - at && v[at + step] < x) {
            lo = at + step + 1;
            step *= 2;
        }
        hi = step < n - at ? at + step : n;
    } else {          /* at or before it */
        hi = at;
        while (step <= at && v[at - step] >= x) {
            hi = at - step;
            step *= 2;
        }
        lo = step <= at ? at - step + 1 : 0;
    }
    return idem__lower_in(v, lo, hi, x);
}

/* ------------------------------------------------------------------------
 * Building */

/* A key frame seen while building: its full hash and offset. */
typedef struct idem__kseen {
    uint64_t h[2];
    uint32_t off;
} idem__kseen;

static int idem__kseen_cmp(const void *a, const void *b)
{
    const idem__kseen *x = a, *y = b;
    if (x->h[0] != y->h[0])
        return x->h[0] < y->h[0] ? -1 : 1;
    if (x->h[1] != y->h[1])
        return x->h[1] < y->h[1] ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* What a walk over the segment's frames gathers. */
typedef struct idem__gather {
    idem__kseen *keys;
    size_t nkeys, capkeys;
    uint32_t *ckpts;
    size_t nckpts, capckpts;
    int64_t max_expires;
    uint64_t max_token, records;
} idem__gather;

static int idem__gather_frame(idem__gather *g, const unsigned char *secret,
                              const idem__frame *f, uint32_t off)
{
    if (f->type == IDEM__R_COMMIT)
        return 0;
    g->records++;
    if (f->rec.token > g->max_token)
        g->max_token = f->rec.token;
    if (f->type == IDEM__R_CHECKPOINT) {
        uint32_t *p = idem__grow(g->ckpts, g->nckpts, &g->capckpts,
                                 sizeof *p, 8);
        if (!p)
            return IDEM_ENOMEM;
        g->ckpts = p;
        g->ckpts[g->nckpts++] = off;
        return 0;
    }
    if (f->type != IDEM__R_FORGET && f->rec.expires > g->max_expires)
        g->max_expires = f->rec.expires;
    idem__kseen *k = idem__grow(g->keys, g->nkeys, &g->capkeys, sizeof *k,
                                1024);
    if (!k)
        return IDEM_ENOMEM;
    g->keys = k;
    k += g->nkeys++;
    idem__key_hash(secret, f->key, f->keylen, k->h);
    k->off = off;
    return 0;
}

static int idem__gather_seg(const idem__segid *sg, const unsigned char *secret,
                            idem__gather *g)
{
    idem__frame f;
    for (uint64_t at = IDEM__SEG_HDR; at < sg->size; at += f.len) {
        if (idem__frame_decode(sg->base + at, sg->size - at, &f, 1))
            return IDEM_ECORRUPT;
        int rc = idem__gather_frame(g, secret, &f, (uint32_t)at);
        if (rc)
            return rc;
    }
    return 0;
}

/* Sort by (hash, offset): the hashes are uniform, so a scatter by their
 * top 16 bits leaves buckets of a few keys each, which an insertion sort
 * finishes; linear time where qsort took a tenth of a cold segment's
 * claims. tmp has room for n. */
static void idem__kseen_sort(idem__kseen *k, size_t n, idem__kseen *tmp,
                             size_t *start)
{
    memset(start, 0, (65536 + 1) * sizeof *start);
    for (size_t i = 0; i < n; i++)
        start[(k[i].h[0] >> 48) + 1]++;
    for (size_t b = 0; b < 65536; b++)
        start[b + 1] += start[b];
    for (size_t i = 0; i < n; i++)
        tmp[start[k[i].h[0] >> 48]++] = k[i];
    /* start[b] is now where bucket b + 1 begins. */
    for (size_t b = 0, from = 0; b < 65536; from = start[b++])
        for (size_t i = from + 1; i < start[b]; i++) {
            idem__kseen x = tmp[i];
            size_t j = i;
            for (; j > from && idem__kseen_cmp(&tmp[j - 1], &x) > 0; j--)
                tmp[j] = tmp[j - 1];
            tmp[j] = x;
        }
    if (n)  /* k is NULL for a segment without keys */
        memcpy(k, tmp, n * sizeof *k);
}

/* Sort, and keep each key's newest frame only. 0 or IDEM_ENOMEM. */
static int idem__dedupe(idem__kseen *k, size_t n, size_t *kept)
{
    idem__kseen *tmp = malloc((n ? n : 1) * sizeof *tmp);
    size_t *start = malloc((65536 + 1) * sizeof *start);
    if (!tmp || !start) {
        free(tmp);
        free(start);
        return IDEM_ENOMEM;
    }
    idem__kseen_sort(k, n, tmp, start);
    free(tmp);
    free(start);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && k[m - 1].h[0] == k[i].h[0] && k[m - 1].h[1] == k[i].h[1])
            m--;
        k[m++] = k[i];
    }
    *kept = m;
    return 0;
}

static void idem__put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint64_t idem__get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t idem__get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Point c's fields into its image, whose header is checked. */
static void idem__cold_point(idem__cold *c)
{
    const unsigned char *h = c->img;
    c->nents = idem__get64(h + 32);
    c->nblocks = idem__get64(h + 40);
    c->max_expires = (int64_t)idem__get64(h + 48);
    c->max_token = idem__get64(h + 56);
    c->records = idem__get64(h + 64);
    c->nckpts = idem__get32(h + 72);
    c->body = idem__get64(h + 80);
    c->blocks = (const uint64_t *)(c->img + IDEM__KIX_HDR);
    c->h0s = (const uint64_t *)(c->img + IDEM__KIX_HDR + c->nblocks * 64);
    c->offs = (const uint32_t *)(c->h0s + c->nents);
    c->ckpts = c->offs + c->nents;
}

/* Bytes of the image for these counts; 0 when they cannot be. */
static size_t idem__kix_len(uint64_t nents, uint64_t nblocks,
                            uint64_t nckpts)
{
    if (nents > (1ull << 36) || nblocks > (1ull << 36) || nckpts > (1u << 30))
        return 0;
    return (size_t)(IDEM__KIX_HDR + nblocks * 64 + nents * 8 +
                    (((nents + nckpts) * 4 + 7) & ~7ull));
}

static void idem__kix_header(unsigned char *h, const idem__segid *sg,
                             const idem__gather *g, uint64_t nents,
                             uint64_t nblocks, size_t len)
{
    uint32_t v = IDEM__KIX_VERSION, k = IDEM__BLOOM_K;
    uint32_t nck = (uint32_t)g->nckpts;
    memcpy(h, idem__kix_magic, 8);
    memcpy(h + 8, &v, 4);
    memcpy(h + 12, &sg->id, 4);
    idem__put64(h + 16, sg->size);
    idem__put64(h + 24, (uint64_t)sg->created);
    idem__put64(h + 32, nents);
    idem__put64(h + 40, nblocks);
    idem__put64(h + 48, (uint64_t)g->max_expires);
    idem__put64(h + 56, g->max_token);
    idem__put64(h + 64, g->records);
    memcpy(h + 72, &nck, 4);
    memcpy(h + 76, &k, 4);
    idem__put64(h + 80, XXH3_64bits(h + IDEM__KIX_HDR, len - IDEM__KIX_HDR));
    idem__put64(h + 120, XXH3_64bits(h, 120));
}

/* Lay out the gathered keys (sorted, distinct) as a file image. */
static int idem__cold_image(const idem__segid *sg, const idem__gather *g,
                            size_t nkeys, idem__cold *c)
{
    uint64_t nblocks = (nkeys * IDEM__BLOOM_BITS + 511) / 512;
    nblocks = nblocks ? nblocks : 1;
    size_t len = idem__kix_len(nkeys, nblocks, g->nckpts);
    unsigned char *img = len ? calloc(1, len) : NULL;
    if (!img)
        return IDEM_ENOMEM;
    uint64_t *blocks = (uint64_t *)(img + IDEM__KIX_HDR);
    uint64_t *h0s = blocks + 8 * nblocks;
    uint32_t *offs = (uint32_t *)(h0s + nkeys);
    for (size_t i = 0; i < nkeys; i++) {
        idem__bloom_add(blocks, nblocks, g->keys[i].h);
        h0s[i] = g->keys[i].h[0];
        offs[i] = g->keys[i].off;
    }
    if (g->nckpts)
        memcpy(offs + nkeys, g->ckpts, g->nckpts * sizeof *g->ckpts);
    idem__kix_header(img, sg, g, nkeys, nblocks, len);
    memset(c, 0, sizeof *c);
    c->img = img;
    c->len = len;
    c->heap = 1;
    idem__cold_point(c);
    return 0;
}

/* Build the index of segment sg into *c (heap). 0, IDEM_ENOMEM, or
 * IDEM_ECORRUPT when a frame does not check out. */
static int idem__cold_build(const idem__segid *sg,
                            const unsigned char *secret, idem__cold *c)
{
    idem__gather g = {.max_expires = 0};
    size_t kept = 0;
    int rc = idem__gather_seg(sg, secret, &g);
    if (!rc)
        rc = idem__dedupe(g.keys, g.nkeys, &kept);
    if (!rc)
        rc = idem__cold_image(sg, &g, kept, c);
    free(g.keys);
    free(g.ckpts);
    return rc;
}

/* ------------------------------------------------------------------------
 * Loading and writing */

/* Does img's header (len bytes in all) check out, and was it built
 * from sg? */
static int idem__kix_head_sound(const unsigned char *img, size_t len,
                                const idem__segid *sg)
{
    if (len < IDEM__KIX_HDR || memcmp(img, idem__kix_magic, 8) != 0 ||
        idem__get64(img + 120) != XXH3_64bits(img, 120) ||
        idem__get32(img + 8) != IDEM__KIX_VERSION ||
        idem__get32(img + 76) != IDEM__BLOOM_K)
        return 0;
    uint64_t nblocks = idem__get64(img + 40);
    if (idem__get32(img + 12) != sg->id || idem__get64(img + 16) != sg->size ||
        (int64_t)idem__get64(img + 24) != sg->created || nblocks == 0 ||
        idem__kix_len(idem__get64(img + 32), nblocks,
                      idem__get32(img + 72)) != len)
        return 0;
    return 1;
}

uint64_t idem__mapped_sum(void *map, size_t len, size_t from)
{
    if (madvise(map, len, MADV_POPULATE_READ) != 0)
        madvise(map, len, MADV_WILLNEED);
    return XXH3_64bits((const unsigned char *)map + from, len - from);
}

int idem__cold_check(idem__cold *c)
{
    if (c->unchecked &&
        c->body == (c->heap ? XXH3_64bits(c->img + IDEM__KIX_HDR,
                                          c->len - IDEM__KIX_HDR)
                            : idem__mapped_sum(c->img, c->len,
                                               IDEM__KIX_HDR)))
        c->unchecked = 0;
    return !c->unchecked;
}

int idem__cold_load(int dirfd, const idem__segid *sg, idem__cold *c,
                    int lazy)
{
    char name[32];
    struct stat st;
    idem__kix_name(name, sizeof name, sg->id);
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? IDEM_ENOTFOUND : IDEM_EIO;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)IDEM__KIX_HDR) {
        close(fd);
        return IDEM_ECORRUPT;
    }
    size_t len = (size_t)st.st_size;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return errno == ENOMEM ? IDEM_ENOMEM : IDEM_EIO;
    /* The header is read by itself: around it the kernel's read-ahead
     * would read the whole index (3.6 GB at 3e8 keys, most of a reopen
     * from a cold page cache). Lookups then read as usual. */
    madvise(p, len, MADV_RANDOM);
    int sound = idem__kix_head_sound(p, len, sg);
    madvise(p, len, MADV_NORMAL);
    memset(c, 0, sizeof *c);
    c->img = p;
    c->len = len;
    if (sound) {
        idem__cold_point(c);
        c->unchecked = 1;
        if (lazy || idem__cold_check(c))
            return 0;
    }
    munmap(p, len);
    memset(c, 0, sizeof *c);
    return IDEM_ECORRUPT;
}

int idem__cold_produce(int dirfd, const idem__segid *sg,
                       const unsigned char *secret, int write,
                       idem__cold *c, int *werr)
{
    int rc = idem__cold_build(sg, secret, c);
    if (rc || !write)
        return rc;
    char name[32];
    idem__kix_name(name, sizeof name, sg->id);
    struct iovec one = {c->img, c->len};
    *werr = idem__dir_put(dirfd, name, &one, 1);
    if (!*werr)
        return 0;
    idem__cold_free(c);
    return IDEM_EIO;
}

int idem__cold_explain(idem_store *s, const char *path, uint32_t id, int rc,
                       int werr)
{
    char name[32];
    idem__kix_name(name, sizeof name, id);
    return rc == IDEM_ENOMEM ? idem__fail(s, rc, "out of memory")
           : rc == IDEM_EIO  ? idem__dir_put_failed(s, path, name, werr)
                             : idem__fail(s, rc,
                                          "%s/seg-%08u.log: a damaged record",
                                          path, id);
}

void idem__cold_adopt(int dirfd, const idem__segid *sg, idem__cold *c)
{
    idem__cold built = *c;
    if (idem__cold_load(dirfd, sg, c, 1) == 0) {
        c->unchecked = 0;
        free(built.img);
    }
    else
        *c = built;
}

int idem__cold_make(idem_store *s, int dirfd, const char *path,
                    const idem__segid *sg, const unsigned char *secret,
                    int write, idem__cold *c)
{
    int werr = 0;
    int rc = idem__cold_produce(dirfd, sg, secret, write, c, &werr);
    if (rc)
        return idem__cold_explain(s, path, sg->id, rc, werr);
    if (write)
        idem__cold_adopt(dirfd, sg, c);
    return 0;
}

void idem__cold_free(idem__cold *c)
{
    if (c->img && c->heap)
        free(c->img);
    else if (c->img)
        munmap(c->img, c->len);
    memset(c, 0, sizeof *c);
}

size_t idem__cold_bytes(const idem__cold *c)
{
    return (size_t)(c->nblocks * 64);
}
