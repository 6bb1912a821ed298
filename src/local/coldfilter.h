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
 * It is built from the key index entries (their 96 bits of hash), never
 * from the segments' frames. A Bloom filter cannot forget, so a segment
 * that drops leaves its bits behind: they cost false positives, never a
 * wrong answer (the segment is gone, nothing is searched there). The
 * filter is built again, at the size its keys need, when the keys it
 * still serves fall below 3/4 of what it was sized for or when a new
 * cold segment does not fit: that keeps its RAM at most 4 bytes per
 * cold key and its false positives at the configured rate.
 *
 * PATH/COLD keeps it between runs, written at a clean close:
 *
 *   off  size  field
 *     0     8  magic "IDEMCFL"
 *     8     4  version (1)
 *    12     4  bits set per key (k)
 *    16     8  XXH3-64 of the store's secret (the keys' hash is keyed)
 *    24     8  blocks (64 bytes each)
 *    32     8  capacity (keys)
 *    40     8  keys set
 *    48     8  segments it holds the keys of (n)
 *    56     8  XXH3-64 of the body
 *    64     8  XXH3-64 of bytes [0, 64)
 *    72        body: n segment identities (32 bytes each), the blocks
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

typedef struct idem__cfseg {
    uint32_t id;
    uint32_t zero;
    uint64_t size;
    int64_t created;
    uint64_t body;           /* XXH3-64 of its key index's body */
} idem__cfseg;

_Static_assert(sizeof(idem__cfseg) == 32, "a segment identity is 32 bytes");

typedef struct idem__cfilter {
    uint64_t *blocks;        /* anonymous pages; NULL: every key may be
                              * cold (none built, or out of memory) */
    uint64_t nblocks;
    uint64_t cap;            /* keys it holds at its configured rate */
    uint64_t set;            /* keys set in it, dropped segments' too */
    uint64_t serves;         /* keys of the cold segments still there */
    idem__cfseg *segs;       /* the segments whose keys it holds */
    size_t nsegs, capsegs;
    int dirty;               /* changed since PATH/COLD was written */
    uint64_t builds;         /* times built from the key indexes */
} idem__cfilter;

/* Might any cold segment hold the key whose hash is h? */
static inline int idem__cfilter_maybe(const idem__cfilter *f,
                                      const uint64_t h[2]);

/* Start loading the block a probe of h reads. */
void idem__cfilter_prefetch(const idem__cfilter *f, const uint64_t h[2]);

/* Segment lg->segs[i] just went cold: set its keys (building the filter
 * again, larger, when they do not fit). 0 or IDEM_ENOMEM (the filter is
 * then gone, and every lookup asks the segments' own filters). */
int idem__cfilter_add(struct idem__log *lg, size_t i);

/* The oldest cold segment, whose index is c, is about to drop. */
void idem__cfilter_gone(idem__cfilter *f, const idem__cold *c);

/* After segments dropped: build again when the filter is far larger
 * than its keys need. 0 or IDEM_ENOMEM, as idem__cfilter_add. */
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
 * from the top of h[0], the 13 bit positions from its low 32 bits and the
 * low 32 of h[1]: the 96 bits a key index entry keeps. */

#define IDEM__CF_K 13u

static inline uint64_t idem__cf_block(uint64_t nblocks, uint64_t h0)
{
    return (uint64_t)(((unsigned __int128)h0 * nblocks) >> 64);
}

static inline void idem__cf_mask(uint64_t h0, uint32_t h1, uint64_t m[8])
{
    uint64_t a = ((uint64_t)h1 << 32) | (h0 & 0xffffffffu);
    uint64_t b = a * 0x9E3779B97F4A7C15ull;
    b ^= b >> 29;
    b *= 0xBF58476D1CE4E5B9ull;
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
    if (!f->blocks)
        return 1;
    uint64_t m[8], missing = 0;
    idem__cf_mask(h[0], (uint32_t)h[1], m);
    const uint64_t *blk = f->blocks + 8 * idem__cf_block(f->nblocks, h[0]);
    for (unsigned w = 0; w < 8; w++)
        missing |= m[w] & ~blk[w];
    return missing == 0;
}

#endif
