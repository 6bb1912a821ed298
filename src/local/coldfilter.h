/* coldfilter.h - one Bloom filter in front of every cold segment.
 *
 * Each cold segment has its own filter in its key index file (cold.h),
 * but a new key, the common case for a claim, would have to ask all of
 * them: with hundreds of cold segments that is hundreds of cache misses
 * a claim. This filter holds the keys of every cold segment at once, so
 * a new key costs one 64-byte block; only a hit (a key that is there, or
 * a false positive at 5e-5) goes on to the segments' own filters, which
 * say which index to search.
 *
 * It is built from the key index entries (their 64 bits of hash), never
 * from the segments' frames. A Bloom filter cannot forget, so a segment
 * that drops leaves its bits behind: they cost false positives, never a
 * wrong answer (the segment is gone, nothing is searched there).
 *
 * Why partitions: the filter is 64 filters, one for each value of the
 * top 6 bits of a key's hash. A filter that is full must be built again
 * larger from every cold key, and at 1e8 keys that took seconds in one
 * go, during which no claim was answered. Since key index entries are
 * sorted by hash, each partition's keys are one slice of every index, so
 * a partition is built again by itself, at 1/64 of the cost; a segment
 * going cold sets its keys in every partition (never waiting for a
 * build) and then pays for a bounded number of partition builds, those
 * that are over their capacity or serve under 3/4 of it, in turn. The
 * next job (coldjob.h), which builds the next segment's key index off
 * the writer's thread, builds them too, and the writer puts them in
 * place when it takes that index. A partition over capacity answers a
 * little more often maybe until its turn comes, never wrongly. Built at
 * a quarter more room than its keys, a partition holds 3 to 3.75 bytes
 * a cold key. Why not more, smaller
 * partitions: at 1e8 cold keys one of 64 is 6 MB, room for the 2 MiB
 * pages that spare a probe its TLB miss (coldfilter.c).
 *
 * PATH/COLD keeps it between runs, written at a clean close:
 *
 *   off  size  field
 *     0     8  magic "IDEMCFL"
 *     8     4  version (3)
 *    12     4  bits set per key (k)
 *    16     8  XXH3-64 of the store's secret (the keys' hash is keyed)
 *    24     8  blocks (64 bytes each), all partitions
 *    32     8  partitions (P, 64)
 *    40     8  keys set, all partitions
 *    48     8  segments it holds the keys of (n)
 *    56     8  XXH3-64 of the body, bytes [72, end)
 *    64     8  XXH3-64 of bytes [0, 64)
 *    72        body: P partitions (blocks, capacity, keys set, keys of
 *              the segments there: 8 bytes each), n segment identities
 *              (32 bytes each), zeros up to a multiple of 64 bytes, the
 *              blocks of each partition in turn
 *
 * Open maps the file rather than reading it into zeroed memory (at 3e8
 * keys a third of a reopen went to zeroing and copying it): the blocks
 * start on a 64-byte boundary so that a probe still reads one cache
 * line. The mapping is read-only; the first change to the filter (a
 * segment going cold) copies every partition into memory of its own, on
 * huge pages, and lets the mapping go, so a file replaced at the next
 * close is never written through and never half old, half new.
 *
 * A segment identity is its id, size, time bucket and the checksum of
 * its key index's body: a segment whose index was built again from other
 * bytes (a repair) is not the one the file holds, and its keys are set
 * again. Open adopts the file only if it checks out whole, and sets the
 * keys of every cold segment it does not name; one that does not check
 * out is never trusted: the filter is built again from the indexes. */
#ifndef IDEM_COLDFILTER_H
#define IDEM_COLDFILTER_H

#include <stddef.h>
#include <stdint.h>

#include "cold.h"

#define IDEM__COLD_FILE "COLD"

struct idem__log;
struct idem__seg;

typedef struct idem__cfseg {
    uint32_t id;
    uint32_t zero;
    uint64_t size;
    int64_t created;
    uint64_t body;           /* XXH3-64 of its key index's body */
} idem__cfseg;

_Static_assert(sizeof(idem__cfseg) == 32, "a segment identity is 32 bytes");

/* The identity of cold segment g (its key index loaded). */
void idem__cfseg_of(idem__cfseg *id, const struct idem__seg *g);

/* One partition: the keys whose hash's top 6 bits are its number. */
typedef struct idem__cfpart {
    uint64_t *blocks;        /* anonymous pages, or the file's (mapped) */
    uint64_t nblocks;
    uint64_t cap;            /* keys it holds at its configured rate */
    uint64_t set;            /* keys set in it, dropped segments' too */
    uint64_t serves;         /* keys of the cold segments still there */
    int mapped;              /* blocks are in the mapping of PATH/COLD:
                              * read-only, never unmapped by themselves */
} idem__cfpart;

#define IDEM__CF_PART_BITS 6u
#define IDEM__CF_PARTS (1u << IDEM__CF_PART_BITS)

typedef struct idem__cfilter {
    idem__cfpart *parts;     /* IDEM__CF_PARTS; NULL: every key may be
                              * cold (none built, or out of memory) */
    idem__cfseg *segs;       /* the segments whose keys it holds */
    size_t nsegs, capsegs;
    unsigned cursor;         /* the partition whose turn to be built
                              * again comes next */
    int dirty;               /* changed since PATH/COLD was written */
    unsigned char *file;     /* PATH/COLD mapped at open, while a
                              * partition's blocks are in it */
    size_t filelen;
    uint64_t builds;         /* partitions built from the key indexes */
    uint64_t due;            /* bit j: partition j is for the next job
                              * to build again (coldjob.h) */
    uint64_t gen;            /* moves whenever every partition goes: a
                              * build planned before is not taken */
} idem__cfilter;

/* A partition built again off the writer's thread: planned by the
 * writer (the slice of partition `part` in each cold segment's index),
 * run by a job (coldjob.h), taken by the writer. While it runs, the
 * indexes it reads stay mapped: a segment drops only once the job is
 * done (idem__log_drop_oldest), and each index was checked when planned,
 * so none is built again under it. */
typedef struct idem__cfbuild {
    unsigned part;
    uint64_t gen;            /* the filter's, when planned */
    size_t nsegs;
    const uint64_t **h0s;    /* each cold segment's entries' hashes */
    uint64_t *cur;           /* its slice: [cur[2i], cur[2i+1]) */
    uint64_t keys;           /* in all the slices */
    idem__cfpart q;          /* the partition built */
    int rc;                  /* 0, or IDEM_ENOMEM: q is none */
} idem__cfbuild;

/* Plan the builds of the partitions marked due: *b (n of them; NULL and
 * 0 when none). 0, or IDEM_ENOMEM/IDEM_ECORRUPT: none planned, and the
 * partitions stay due. */
int idem__cfilter_plan(struct idem__log *lg, idem__cfbuild **b, size_t *n);

/* Do a planned build. Touches b and the indexes it names alone, so any
 * thread may run it. */
void idem__cfbuild_run(idem__cfbuild *b);

/* Put each partition built in place of the one there, and free b. */
void idem__cfilter_take(struct idem__log *lg, idem__cfbuild *b, size_t n);

/* Free planned builds, run or not, without taking them. */
void idem__cfbuild_free(idem__cfbuild *b, size_t n);

/* Might any cold segment hold the key whose hash is h? */
static inline int idem__cfilter_maybe(const idem__cfilter *f,
                                      const uint64_t h[2]);

/* Start loading the block a probe of h reads. */
void idem__cfilter_prefetch(const idem__cfilter *f, const uint64_t h[2]);

/* Segment lg->segs[i] just went cold: set its keys, then mark the
 * partitions whose turn it is (see above) for the next job to build
 * again (idem__cfilter_plan). 0 or IDEM_ENOMEM (the
 * filter is then gone, and every lookup asks the segments' own
 * filters). */
int idem__cfilter_add(struct idem__log *lg, size_t i);

/* The oldest cold segment, whose index is c and identity id, is about
 * to drop. */
void idem__cfilter_gone(idem__cfilter *f, const idem__cold *c, uint32_t id);

/* After segments dropped: build again, in turn, partitions far larger
 * than their keys need. 0 or IDEM_ENOMEM, as idem__cfilter_add. */
int idem__cfilter_fit(struct idem__log *lg);

/* At open, after the cold segments are loaded: adopt PATH/COLD if it
 * checks out, and set the keys of the segments it does not hold; else
 * build it from the indexes (without memory for it, there is none). */
void idem__cfilter_open(struct idem__log *lg);

/* At a clean close: write PATH/COLD if the filter changed. */
int idem__cfilter_save(struct idem__log *lg);

/* Does PATH/COLD, if there is one, check out whole? (check/repair) */
int idem__cfilter_file_sound(int dirfd);

void idem__cfilter_free(idem__cfilter *f);

/* RAM the filter holds. */
size_t idem__cfilter_bytes(const idem__cfilter *f);

/* ------------------------------------------------------------------------
 * Inline: the probe every claim of a key RAM lacks makes. The block comes
 * from the top of h[0], the 13 bit positions from a mix of all of h[0]:
 * the 64 bits a key index entry keeps. Keys of one block differ in the
 * bits below those that chose it, and the mix spreads them over every
 * position. */

#define IDEM__CF_K 13u

/* The partition of h, and the block in it: the top 6 bits of h[0] and
 * the bits below them. */
static inline unsigned idem__cf_part(uint64_t h0)
{
    return (unsigned)(h0 >> (64 - IDEM__CF_PART_BITS));
}

static inline uint64_t idem__cf_block(uint64_t nblocks, uint64_t h0)
{
    return (uint64_t)(((unsigned __int128)(h0 << IDEM__CF_PART_BITS) *
                       nblocks) >> 64);
}

static inline void idem__cf_mask(uint64_t h0, uint64_t m[8])
{
    uint64_t a = h0 ^ (h0 >> 31);
    a *= 0xBF58476D1CE4E5B9ull;
    a ^= a >> 29;
    uint64_t b = a * 0x9E3779B97F4A7C15ull;
    b ^= b >> 32;
    for (unsigned w = 0; w < 8; w++)
        m[w] = 0;
    for (unsigned i = 0; i < IDEM__CF_K; i++) {
        uint64_t *x = i < 7 ? &a : &b;
        unsigned pos = (unsigned)(*x & 511u);
        *x >>= 9;
        m[pos >> 6] |= 1ull << (pos & 63);
    }
}

static inline int idem__cfilter_maybe(const idem__cfilter *f,
                                      const uint64_t h[2])
{
    if (!f->parts)
        return 1;
    const idem__cfpart *p = &f->parts[idem__cf_part(h[0])];
    uint64_t m[8], missing = 0;
    idem__cf_mask(h[0], m);
    const uint64_t *blk = p->blocks + 8 * idem__cf_block(p->nblocks, h[0]);
    for (unsigned w = 0; w < 8; w++)
        missing |= m[w] & ~blk[w];
    return missing == 0;
}

#endif
