/* coldfilter.c - building, growing and keeping the filter in front of
 * the cold segments (layout and rules in coldfilter.h).
 *
 * Why build again rather than count or delete: segments drop whole and
 * oldest first, so a filter that forgets nothing only carries the bits
 * of keys that are gone, and building a partition again when those make
 * up a quarter of it costs, spread over the keys that went cold since, a
 * few inserts a key (each a 16-byte read of an index entry and one cache
 * line written), against a probe per cold segment for every new key
 * saved. Each segment going cold pays for builds of up to 8 inserts per
 * key it brings, twice what keeping up needs, so partitions fall behind
 * by a few segments at most, and no claim waits for more than that.
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

#define IDEM__CF_VERSION 4u
#define IDEM__CF_HDR 72u
#define IDEM__CF_PART_REC 32u        /* a partition in the file */
#define IDEM__CF_BITS 24u            /* per key of capacity */
#define IDEM__CF_MIN_CAP 256u        /* keys a partition has room for */
#define IDEM__CF_EFFORT 8u           /* inserts of builds per key gone cold */

static const unsigned char idem__cf_magic[8] = "IDEMCFL";

void idem__cfilter_prefetch(const idem__cfilter *f, const uint64_t h[2])
{
    if (!f->parts)
        return;
    const idem__cfpart *p = &f->parts[idem__cf_part(h[0])];
    __builtin_prefetch(p->blocks + 8 * idem__cf_block(p->nblocks, h[0]));
}

static void idem__cf_part_unmap(idem__cfpart *p)
{
    if (p->blocks && !p->mapped)
        munmap(p->blocks, (size_t)p->nblocks * 64);
    memset(p, 0, sizeof *p);
}

static void idem__cf_unmap(idem__cfilter *f)
{
    for (unsigned j = 0; f->parts && j < IDEM__CF_PARTS; j++)
        idem__cf_part_unmap(&f->parts[j]);
    free(f->parts);
    f->parts = NULL;
    f->nsegs = 0;
    f->due = 0;
    f->gen++;
    if (f->file)
        munmap(f->file, f->filelen);
    f->file = NULL;
}

void idem__cfilter_free(idem__cfilter *f)
{
    idem__cf_unmap(f);
    free(f->segs);
    memset(f, 0, sizeof *f);
}

static uint64_t idem__cf_total(const idem__cfilter *f, size_t field)
{
    uint64_t n = 0;
    for (unsigned j = 0; f->parts && j < IDEM__CF_PARTS; j++) {
        const idem__cfpart *p = &f->parts[j];
        n += field == 0 ? p->nblocks : field == 1 ? p->set : p->cap;
    }
    return n;
}

size_t idem__cfilter_bytes(const idem__cfilter *f)
{
    return (size_t)idem__cf_total(f, 0) * 64;
}

/* Zeroed pages for len bytes. Every probe of a new key lands on a random
 * block, so with 4 KiB pages nearly every probe also misses the TLB:
 * past 2 MiB the room starts on a 2 MiB boundary and is marked for
 * transparent huge pages (a hint; the tail under 2 MiB keeps small
 * pages). NULL without memory. */
static void *idem__cf_pages(size_t len)
{
    const size_t huge = 2u << 20, page = 4096;
    int prot = PROT_READ | PROT_WRITE, how = MAP_PRIVATE | MAP_ANONYMOUS;
    if (len < huge) {
        void *m = mmap(NULL, len, prot, how, -1, 0);
        return m == MAP_FAILED ? NULL : m;
    }
    size_t mlen = (len + page - 1) & ~(page - 1);
    unsigned char *m = mmap(NULL, mlen + huge, prot, how, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    size_t head = (huge - ((uintptr_t)m & (huge - 1))) & (huge - 1);
    if (head)
        munmap(m, head);
    if (huge - head)
        munmap(m + head + mlen, huge - head);
    madvise(m + head, mlen, MADV_HUGEPAGE);
    return m + head;
}

/* The blocks of a partition with room for cap keys (cap at least
 * IDEM__CF_MIN_CAP, at most 2^40). */
static uint64_t idem__cf_nblocks(uint64_t cap)
{
    return (cap * IDEM__CF_BITS + 511) / 512;
}

/* Zeroed, page-aligned room for a partition of cap keys. 0 or ENOMEM. */
static int idem__cf_part_map(idem__cfpart *p, uint64_t cap)
{
    cap = cap < IDEM__CF_MIN_CAP ? IDEM__CF_MIN_CAP : cap;
    if (cap > (1ull << 40))
        return IDEM_ENOMEM;
    uint64_t nblocks = idem__cf_nblocks(cap);
    if (nblocks > SIZE_MAX / 64)
        return IDEM_ENOMEM;
    void *m = idem__cf_pages((size_t)nblocks * 64);
    if (!m)
        return IDEM_ENOMEM;
    memset(p, 0, sizeof *p);
    p->blocks = m;
    p->nblocks = nblocks;
    p->cap = cap;
    return 0;
}

/* Room for the partition table, every partition empty. */
static int idem__cf_alloc(idem__cfilter *f)
{
    f->parts = calloc(IDEM__CF_PARTS, sizeof *f->parts);
    f->nsegs = 0;
    return f->parts ? 0 : IDEM_ENOMEM;
}

void idem__cfseg_of(idem__cfseg *id, const idem__seg *g)
{
    memset(id, 0, sizeof *id);
    id->id = g->id;
    id->size = g->size;
    id->created = g->created;
    id->body = g->cold->body;
}

/* Entries [*from, *to) of c are partition j's: the slice of the sorted
 * entries whose hash's top bits are j. */
static void idem__cf_slice(const idem__cold *c, unsigned j, uint64_t *from,
                           uint64_t *to)
{
    const unsigned shift = 64 - IDEM__CF_PART_BITS;
    uint64_t lo[2] = {(uint64_t)j << shift, 0};
    uint64_t hi[2] = {((uint64_t)j + 1) << shift, 0};
    *from = idem__cold_lower(c, lo);
    *to = j + 1 < IDEM__CF_PARTS ? idem__cold_lower(c, hi) : c->nents;
}

/* Set the key whose hash begins with h0 in partition p. */
static void idem__cf_put(idem__cfpart *p, uint64_t h0)
{
    uint64_t m[8];
    idem__cf_mask(h0, m);
    uint64_t *blk = p->blocks + 8 * idem__cf_block(p->nblocks, h0);
    for (unsigned w = 0; w < 8; w++)
        blk[w] |= m[w];
}

/* Set entries [from, to) of h0s, all of partition p. Loads of blocks a
 * few entries ahead overlap with the writes. */
static void idem__cf_set_range(idem__cfpart *p, const uint64_t *h0s,
                               uint64_t from, uint64_t to)
{
    enum { AHEAD = 16 };
    for (uint64_t i = from; i < to; i++) {
        if (i + AHEAD < to)
            __builtin_prefetch(
                p->blocks + 8 * idem__cf_block(p->nblocks, h0s[i + AHEAD]),
                1);
        idem__cf_put(p, h0s[i]);
    }
    p->set += to - from;
}

/* Name cold segment g among those whose keys f holds. */
static int idem__cf_name(idem__cfilter *f, const idem__seg *g)
{
    idem__cfseg *s = idem__grow(f->segs, f->nsegs, &f->capsegs, sizeof *s,
                                64);
    if (!s)
        return IDEM_ENOMEM;
    f->segs = s;
    idem__cfseg_of(&f->segs[f->nsegs++], g);
    return 0;
}

/* Copy the partitions still in the mapping of PATH/COLD into memory of
 * their own, which can be written, and let the mapping go. 0 or
 * IDEM_ENOMEM (then nothing changed). */
static int idem__cf_own(idem__cfilter *f)
{
    for (unsigned j = 0; f->file && j < IDEM__CF_PARTS; j++) {
        idem__cfpart *p = &f->parts[j], q;
        if (!p->mapped)
            continue;
        if (idem__cf_part_map(&q, p->cap))
            return IDEM_ENOMEM;
        memcpy(q.blocks, p->blocks, (size_t)p->nblocks * 64);
        q.set = p->set;
        q.serves = p->serves;
        *p = q;
    }
    if (f->file)
        munmap(f->file, f->filelen);
    f->file = NULL;
    return 0;
}

/* Set the keys of cold segment g in every partition, and name it among
 * those held. */
static int idem__cf_set(idem__log *lg, idem__seg *g)
{
    idem__cfilter *f = &lg->cf;
    if (idem__log_cold_sound(lg, g) || idem__cf_own(f) || idem__cf_name(f, g))
        return IDEM_ENOMEM;
    for (unsigned j = 0; j < IDEM__CF_PARTS; j++) {
        uint64_t from, to;
        idem__cf_slice(g->cold, j, &from, &to);
        idem__cf_set_range(&f->parts[j], g->cold->h0s, from, to);
        f->parts[j].serves += to - from;
    }
    f->dirty = 1;
    return 0;
}

/* Set in b->q, a partition of nothing yet, every cold segment's slice
 * of partition b->part: [cur[2i], cur[2i+1]) of h0s[i] for segment i. A
 * chunk of blocks at a time: the slices are sorted and a key's block
 * grows with its hash, so each segment's next keys are those of the
 * chunk being written, and the chunk stays in the core's cache while
 * every segment passes through it. Setting one segment after another
 * instead sweeps the whole partition once per segment, a cache miss per
 * key as soon as the partition outgrows the cache (at 3e8 keys a
 * partition is 14 MB and a segment's slice a few thousand keys). */
static void idem__cf_fill(idem__cfbuild *b)
{
    enum { CHUNK = 4096 }; /* blocks: 256 KB, well within a core's L2 */
    idem__cfpart *q = &b->q;
    uint64_t *cur = b->cur;
    for (uint64_t lim = CHUNK; lim - CHUNK < q->nblocks; lim += CHUNK) {
        /* The last chunk takes whatever is left, so that every key is
         * set even if a slice were out of order. */
        uint64_t stop = lim < q->nblocks ? lim : UINT64_MAX;
        for (size_t i = 0; i < b->nsegs; i++) {
            const uint64_t *h0s = b->h0s[i];
            uint64_t k = cur[2 * i], to = cur[2 * i + 1];
            while (k < to && idem__cf_block(q->nblocks, h0s[k]) < stop)
                idem__cf_put(q, h0s[k++]);
            q->set += k - cur[2 * i];
            cur[2 * i] = k;
        }
    }
}

void idem__cfbuild_free(idem__cfbuild *b, size_t n)
{
    for (size_t i = 0; b && i < n; i++) {
        free(b[i].h0s);
        free(b[i].cur);
        idem__cf_part_unmap(&b[i].q);
    }
    free(b);
}

/* Plan in *b the build of partition j from every cold segment's slice
 * of it, each segment's index checked first. 0, IDEM_ENOMEM, or
 * IDEM_ECORRUPT (an index that does not check out and cannot be built
 * again); idem__cfbuild_free() frees *b either way. */
static int idem__cf_plan_one(idem__log *lg, unsigned j, idem__cfbuild *b)
{
    memset(b, 0, sizeof *b);
    b->part = j;
    b->gen = lg->cf.gen;
    b->h0s = malloc((lg->ncold + 1) * sizeof *b->h0s);
    b->cur = malloc((lg->ncold + 1) * 2 * sizeof *b->cur);
    if (!b->h0s || !b->cur)
        return IDEM_ENOMEM;
    for (size_t i = 0; i < lg->ncold; i++) {
        if (idem__log_cold_sound(lg, &lg->segs[i]))
            return IDEM_ECORRUPT;
        const idem__cold *c = lg->segs[i].cold;
        b->h0s[i] = c->h0s;
        idem__cf_slice(c, j, &b->cur[2 * i], &b->cur[2 * i + 1]);
        b->keys += b->cur[2 * i + 1] - b->cur[2 * i];
        b->nsegs = i + 1;
    }
    return 0;
}

void idem__cfbuild_run(idem__cfbuild *b)
{
    b->rc = idem__cf_part_map(&b->q, b->keys + b->keys / 4);
    if (!b->rc)
        idem__cf_fill(b);
}

/* The keys of the cold segments in partition j. */
static uint64_t idem__cf_serves(const idem__log *lg, unsigned j)
{
    uint64_t n = 0;
    for (size_t i = 0; i < lg->ncold; i++) {
        uint64_t from, to;
        idem__cf_slice(lg->segs[i].cold, j, &from, &to);
        n += to - from;
    }
    return n;
}

/* Put the partition b built in place of the one there, if the filter is
 * still the one b was planned in. It holds the keys of every segment
 * cold then, and none went cold since (only the writer makes them
 * cold, after it took the builds); of those that dropped since, it
 * holds bits no longer needed, as any partition does. */
static void idem__cf_take_one(idem__log *lg, idem__cfbuild *b)
{
    idem__cfilter *f = &lg->cf;
    if (!f->parts || b->gen != f->gen)
        return;
    if (b->rc) {  /* no room for it: its turn comes again */
        f->due |= 1ull << b->part;
        return;
    }
    idem__cfpart *p = &f->parts[b->part];
    b->q.serves = idem__cf_serves(lg, b->part);
    idem__cf_part_unmap(p);
    *p = b->q;
    memset(&b->q, 0, sizeof b->q);
    f->dirty = 1;
    f->builds++;
}

void idem__cfilter_take(idem__log *lg, idem__cfbuild *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        idem__cf_take_one(lg, &b[i]);
    idem__cfbuild_free(b, n);
}

int idem__cfilter_plan(idem__log *lg, idem__cfbuild **out, size_t *n)
{
    idem__cfilter *f = &lg->cf;
    unsigned due = (unsigned)__builtin_popcountll(f->due);
    *out = NULL;
    *n = 0;
    if (!due || !f->parts)
        return 0;
    idem__cfbuild *b = calloc(due, sizeof *b);
    if (!b)
        return IDEM_ENOMEM;
    size_t k = 0;
    int rc = 0;
    for (unsigned j = 0; !rc && j < IDEM__CF_PARTS; j++)
        if (f->due >> j & 1)
            rc = idem__cf_plan_one(lg, j, &b[k++]);
    if (rc) {
        idem__cfbuild_free(b, k);
        return rc;
    }
    f->due = 0;
    *out = b;
    *n = k;
    return 0;
}

/* Build partition j again, here and now, with room for a quarter more
 * keys than it serves. Without memory for it, or with an index that
 * does not check out and cannot be built again, the old one stays: it
 * holds every key the new one would (and more), so it is never wrong. */
static int idem__cf_part_build(idem__log *lg, unsigned j)
{
    idem__cfbuild *b = calloc(1, sizeof *b);
    int rc = b ? idem__cf_plan_one(lg, j, b) : IDEM_ENOMEM;
    if (!rc) {
        idem__cfbuild_run(b);
        rc = b->rc;
    }
    if (!rc)
        idem__cf_take_one(lg, b);
    idem__cfbuild_free(b, b ? 1 : 0);
    return rc;
}

/* Is partition p over its capacity, or far larger than its keys need?
 * urgent: only twice over its capacity (false positives well past the
 * configured rate). */
static int idem__cf_part_due(const idem__cfpart *p, int urgent)
{
    if (urgent)
        return p->set > 2 * p->cap;
    return p->set > p->cap ||
           (p->cap > IDEM__CF_MIN_CAP && p->serves * 4 < p->cap * 3);
}

/* Build again, in turn from the cursor, the partitions that are due,
 * until about budget inserts were spent (0: no limit); with defer, mark
 * them for the next job to build instead (f->due). */
static void idem__cf_tend(idem__log *lg, uint64_t budget, int urgent,
                          int defer)
{
    idem__cfilter *f = &lg->cf;
    uint64_t spent = 0;
    for (unsigned n = 0; n < IDEM__CF_PARTS; n++) {
        if (budget && spent >= budget)
            return;
        unsigned j = f->cursor;
        f->cursor = (f->cursor + 1) % IDEM__CF_PARTS;
        uint64_t bit = 1ull << j;
        if ((defer && (f->due & bit)) ||
            !idem__cf_part_due(&f->parts[j], urgent))
            continue;
        if (defer)
            f->due |= bit;
        else if (idem__cf_part_build(lg, j) != 0)
            continue;
        else
            f->due &= ~bit;
        spent += f->parts[j].serves;
    }
}

/* Build the whole filter from every cold segment's index: each
 * partition sized for its keys. Without memory there is none, which is
 * slow, not wrong. */
static int idem__cf_build(idem__log *lg)
{
    idem__cfilter *f = &lg->cf;
    idem__cf_unmap(f);
    f->dirty = 1;
    int rc = idem__cf_alloc(f);
    for (unsigned j = 0; !rc && j < IDEM__CF_PARTS; j++)
        rc = idem__cf_part_build(lg, j);
    for (size_t i = 0; !rc && i < lg->ncold; i++)
        rc = idem__cf_name(f, &lg->segs[i]);
    if (rc)
        idem__cf_unmap(f);
    return rc;
}

int idem__cfilter_add(idem__log *lg, size_t i)
{
    idem__cfilter *f = &lg->cf;
    if (!f->parts)
        return idem__cf_build(lg);
    int rc = idem__cf_set(lg, &lg->segs[i]);
    if (rc) {
        idem__cf_unmap(f);
        return rc;
    }
    uint64_t n = lg->segs[i].cold->nents;
    idem__cf_tend(lg, (n ? n : 1) * IDEM__CF_EFFORT, 0, 1);
    return 0;
}

void idem__cfilter_gone(idem__cfilter *f, const idem__cold *c, uint32_t id)
{
    for (unsigned j = 0; f->parts && j < IDEM__CF_PARTS; j++) {
        uint64_t from, to, *serves = &f->parts[j].serves;
        idem__cf_slice(c, j, &from, &to);
        *serves -= to - from < *serves ? to - from : *serves;
    }
    for (size_t i = 0; i < f->nsegs; i++)
        if (f->segs[i].id == id) {
            memmove(f->segs + i, f->segs + i + 1,
                    (f->nsegs - i - 1) * sizeof *f->segs);
            f->nsegs--;
            f->dirty = 1;
            break;
        }
}

int idem__cfilter_fit(idem__log *lg)
{
    idem__cfilter *f = &lg->cf;
    if (!lg->ncold) {
        if (f->parts)
            f->dirty = 1;
        idem__cf_unmap(f);
        return 0;
    }
    if (!f->parts)
        return 0;
    /* The keys of one cold segment, on average, worth of builds: what a
     * segment going cold pays (idem__cfilter_add). */
    uint64_t serves = 0;
    for (size_t i = 0; i < lg->ncold; i++)
        serves += lg->segs[i].cold->nents;
    idem__cf_tend(lg, (serves / lg->ncold + 1) * IDEM__CF_EFFORT, 0, 0);
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

/* The header's counts, if it checks out by itself and matches the file's
 * length. */
typedef struct idem__cfhdr {
    uint64_t secret, nblocks, set, nsegs, body;
} idem__cfhdr;

/* Where the blocks start in a file holding nsegs segments: after the
 * table and segments, on a 64-byte boundary. */
static uint64_t idem__cf_blocks_at(uint64_t nsegs)
{
    uint64_t end = IDEM__CF_HDR + (uint64_t)IDEM__CF_PARTS * IDEM__CF_PART_REC +
                   nsegs * 32;
    return (end + 63) & ~63ull;
}

static int idem__cf_header(const unsigned char *h, uint64_t len,
                           idem__cfhdr *o)
{
    uint32_t version, k;
    memcpy(&version, h + 8, 4);
    memcpy(&k, h + 12, 4);
    if (memcmp(h, idem__cf_magic, 8) != 0 || version != IDEM__CF_VERSION ||
        k != IDEM__CF_K || idem__cf_get64(h + 64) != XXH3_64bits(h, 64) ||
        idem__cf_get64(h + 32) != IDEM__CF_PARTS)
        return 0;
    o->secret = idem__cf_get64(h + 16);
    o->nblocks = idem__cf_get64(h + 24);
    o->set = idem__cf_get64(h + 40);
    o->nsegs = idem__cf_get64(h + 48);
    o->body = idem__cf_get64(h + 56);
    return o->nblocks && o->nblocks < (1ull << 40) &&
           o->nsegs < (1ull << 32) &&
           len == idem__cf_blocks_at(o->nsegs) + o->nblocks * 64;
}

/* Point f's partitions at their blocks in the mapped file m, if the
 * table (as in the file) adds up to nblocks and gives each partition
 * the blocks its capacity does. 0 or -1. */
static int idem__cf_map_table(idem__cfilter *f, const unsigned char *m,
                              uint64_t nblocks, uint64_t nsegs)
{
    const unsigned char *t = m + IDEM__CF_HDR;
    uint64_t sum = 0;
    if (idem__cf_alloc(f))
        return -1;
    for (unsigned j = 0; j < IDEM__CF_PARTS; j++) {
        const unsigned char *r = t + j * IDEM__CF_PART_REC;
        uint64_t nb = idem__cf_get64(r), cap = idem__cf_get64(r + 8);
        if (nb == 0 || nb > nblocks - sum || cap < IDEM__CF_MIN_CAP ||
            cap > (1ull << 40) || nb != idem__cf_nblocks(cap))
            return -1;
        f->parts[j] = (idem__cfpart){
            .blocks = (uint64_t *)(void *)(m + idem__cf_blocks_at(nsegs) +
                                           sum * 64),
            .nblocks = nb,
            .cap = cap,
            .set = idem__cf_get64(r + 16),
            .serves = idem__cf_get64(r + 24),
            .mapped = 1,
        };
        sum += nb;
    }
    return sum == nblocks ? 0 : -1;
}

/* Map the file into f (partitions, segments) if it checks out whole.
 * 0, or -1 (absent, damaged, another store's, unreadable, no memory). */
static int idem__cf_read(int fd, uint64_t secret, idem__cfilter *f)
{
    struct stat st;
    idem__cfhdr o;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)IDEM__CF_HDR)
        return -1;
    size_t len = (size_t)st.st_size;
    /* Populated at once: the checksum reads every page anyway. */
    unsigned char *m = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE,
                            fd, 0);
    if (m == MAP_FAILED)
        return -1;
    idem__cfseg *segs = NULL;
    int ok = idem__cf_header(m, len, &o) && (!secret || o.secret == secret) &&
             XXH3_64bits(m + IDEM__CF_HDR, len - IDEM__CF_HDR) == o.body &&
             (segs = malloc(o.nsegs ? o.nsegs * 32 : 1)) != NULL;
    f->file = m;
    f->filelen = len;
    if (!ok || idem__cf_map_table(f, m, o.nblocks, o.nsegs) != 0) {
        free(segs);
        idem__cf_unmap(f);
        return -1;
    }
    memcpy(segs, m + IDEM__CF_HDR + IDEM__CF_PARTS * IDEM__CF_PART_REC,
           o.nsegs * 32);
    free(f->segs);
    f->segs = segs;
    f->nsegs = f->capsegs = (size_t)o.nsegs;
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

/* Is g among the first n segments f names? */
static int idem__cf_holds(const idem__cfilter *f, size_t n, const idem__seg *g)
{
    idem__cfseg id;
    idem__cfseg_of(&id, g);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&f->segs[i], &id, sizeof id) == 0)
            return 1;
    return 0;
}

/* The file's filter, with the keys of the cold segments it does not
 * name set (partitions over their capacity are then built again); -1
 * when it cannot serve (none, damaged). */
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
    /* The file counts the keys each partition serves as of its close;
     * segments dropped since (a crash kept it from being written again)
     * stay counted: a partition is built again a little later, which
     * costs false positives, never an answer. */
    for (size_t i = 0; i < lg->ncold; i++)
        if (!idem__cf_holds(f, held, &lg->segs[i]) &&
            idem__cf_set(lg, &lg->segs[i]) != 0)
            return -1;
    f->dirty = f->nsegs != held;
    return 0;
}

void idem__cfilter_open(idem__log *lg)
{
    if (!lg->ncold)
        return;
    /* Without memory for it, lookups ask each segment's own filter.
     * Partitions a little over their capacity (a clean close leaves a
     * few, whose turn had not come) wait for their turn, as they did
     * before the close: a build reads a slice of every key index, and
     * so checks every one whole (5.7 GB at 3e8 keys) at open. Only a
     * partition twice over (a crash left an old file, and many segments'
     * keys were set again) is built at once. */
    if (idem__cf_adopt(lg) == 0)
        idem__cf_tend(lg, 0, 1, 0);
    else
        (void)idem__cf_build(lg);
}

/* The partition table as the file has it. */
static void idem__cf_table(const idem__cfilter *f, unsigned char *t)
{
    for (unsigned j = 0; j < IDEM__CF_PARTS; j++) {
        const idem__cfpart *p = &f->parts[j];
        uint64_t r[4] = {p->nblocks, p->cap, p->set, p->serves};
        memcpy(t + j * IDEM__CF_PART_REC, r, sizeof r);
    }
}

/* The header of the file whose body is iov[0, n). 0 or IDEM_ENOMEM. */
static int idem__cf_head(const idem__log *lg, const struct iovec *iov, int n,
                         unsigned char *h)
{
    const idem__cfilter *f = &lg->cf;
    XXH3_state_t *x = XXH3_createState();
    if (!x)
        return IDEM_ENOMEM;
    XXH3_64bits_reset(x);
    for (int i = 0; i < n; i++)
        XXH3_64bits_update(x, iov[i].iov_base, iov[i].iov_len);
    uint32_t version = IDEM__CF_VERSION, k = IDEM__CF_K;
    uint64_t v[6] = {idem__cf_secret_hash(lg), idem__cf_total(f, 0),
                     IDEM__CF_PARTS, idem__cf_total(f, 1), f->nsegs,
                     XXH3_64bits_digest(x)};
    XXH3_freeState(x);
    memset(h, 0, IDEM__CF_HDR);
    memcpy(h, idem__cf_magic, 8);
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &k, 4);
    memcpy(h + 16, v, sizeof v);
    uint64_t check = XXH3_64bits(h, 64);
    memcpy(h + 64, &check, 8);
    return 0;
}

int idem__cfilter_save(idem__log *lg)
{
    idem__cfilter *f = &lg->cf;
    if (!f->dirty || lg->readonly || lg->memory || lg->dirfd < 0)
        return 0;
    if (!f->parts) {
        /* Nothing cold (or no memory for it): a file left would name
         * segments that may come back with other keys set. */
        if (unlinkat(lg->dirfd, IDEM__COLD_FILE, 0) != 0 && errno != ENOENT)
            return idem__fail(lg->s, IDEM_EIO, "%s/%s: %s", lg->dir,
                              IDEM__COLD_FILE, strerror(errno));
        f->dirty = 0;
        return 0;
    }
    static const unsigned char zeros[64];
    unsigned char t[IDEM__CF_PARTS * IDEM__CF_PART_REC];
    unsigned char h[IDEM__CF_HDR];
    struct iovec iov[4 + IDEM__CF_PARTS];
    idem__cf_table(f, t);
    uint64_t end = IDEM__CF_HDR + sizeof t + f->nsegs * 32;
    iov[0] = (struct iovec){h, sizeof h};
    iov[1] = (struct iovec){t, sizeof t};
    iov[2] = (struct iovec){f->segs, f->nsegs * 32};
    iov[3] = (struct iovec){(void *)zeros,
                            (size_t)(idem__cf_blocks_at(f->nsegs) - end)};
    for (unsigned j = 0; j < IDEM__CF_PARTS; j++)
        iov[4 + j] = (struct iovec){f->parts[j].blocks,
                                    (size_t)f->parts[j].nblocks * 64};
    if (idem__cf_head(lg, iov + 1, 3 + IDEM__CF_PARTS, h))
        return idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
    int rc = idem__dir_replace_v(lg->s, lg->dirfd, lg->dir, IDEM__COLD_FILE,
                                 iov, 4 + IDEM__CF_PARTS);
    f->dirty = rc != 0;
    return rc;
}
