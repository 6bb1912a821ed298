/* coldgroup.h - one Bloom filter for each group of 16 cold segments, and
 * one for each run of 16 groups.
 *
 * The filter in front (coldfilter.h) tells a new key from a cold one,
 * but not which segment holds a cold key: a lookup that it lets through
 * asked every cold segment's own filter, newest first, until one said
 * maybe. With hundreds of cold segments that was ~170 cache (and TLB)
 * misses a lookup of a key that is there. Segments are grouped by id,
 * 16 to a group (ids [16 g, 16 g + 16)); once the newest of a group goes
 * cold, a filter of all its keys is written beside the segments, and a
 * lookup asks the groups' filters newest first and only the segments of
 * a group that says maybe: about G/2 + 8 probes for G groups, not 8 G.
 *
 * Runs do for groups what groups do for segments. At 3e8 keys there are
 * 287 groups, and a key half a day old cost ~140 probes of their filters
 * (100 k lookups a second); runs of 256 segments (ids [256 r, 256 r +
 * 256)) bring a key anywhere in the store to about R/2 + 8 + 8 probes for
 * R runs (18 at 3e8). A run's filter costs 2 bytes a key of disk, which
 * the key indexes' 12-byte entries (cold.h) paid for. A run is built
 * once its newest segment goes cold, from its 256 key indexes: 16.7 M
 * keys at 65 k keys a segment, a quarter of a second, once per 256
 * segments.
 *
 * Why a file, mapped, and not RAM: its pages are the page cache's, as
 * the key indexes' are, so the RAM budget (anonymous memory a cold key
 * costs) does not grow; a group never changes once built, so a file
 * written whole once is never half old, half new.
 *
 * Why lanes: a filter of a group's keys says whether one of its 16
 * members (segments of a group, groups of a run) might hold a key, not
 * which; asking each member's own filter after it was 16 probes more, on
 * 16 pages of 16 files, each a TLB miss (two on a virtual machine,
 * whose page walks are nested) and a cache miss, and the oldest keys
 * cost 38 probes at 3e8 keys. So a group's file holds 16 filters, one a
 * member (its lane), and a key's block in each of them sits side by
 * side: a stripe of 16 blocks of 128 bits, 256 bytes, four cache lines
 * of one page. One probe reads the stripe and tells which members might
 * hold the key; at level 0 those are the segments whose key indexes are
 * searched (their own filters are passed over), at level 1 the groups
 * whose stripes are read next. The lanes cost what one filter of all
 * the keys did, when members hold as many keys as each other (a lane has
 * the blocks of the fullest).
 *
 * Why 128-bit blocks and not a cache line each: a stripe of 64-byte
 * blocks is 16 lines, and reading them cost more than the page walks it
 * saved (replays of the oldest keys at 3e8: no faster than 38 probes of
 * one line each, the middle ones 30 % slower). A 128-bit block holds 8
 * keys on average, where a wider one would hold more per bit; at 16 bits
 * a key with k = 8 a lane says maybe wrongly about 2e-3 of the time
 * (5e-4 with 512-bit blocks), and that costs a search of a key index or
 * a stripe, never an answer: 1 byte a key more on disk would cost more
 * than the searches it spares.
 *
 * PATH/grp-00000001.kgf, group 1 (segments 16 to 31), and
 * PATH/run-00000001.kgf, run 1 (segments 256 to 511), span S (16, 256):
 *
 *   off  size  field
 *     0     8  magic "IDEMKGF"
 *     8     4  version (4: lanes of 128-bit blocks)
 *    12     4  group number
 *    16     8  members (n, at most S)
 *    24     8  64-byte lines of filter: 4 B for B stripes
 *    32     8  keys set
 *    40     8  XXH3-64 of the body
 *    48     8  span S
 *    56     8  XXH3-64 of bytes [0, 56)
 *    64  32 S  S segment identities (coldfilter.h), n of them used
 *     ...      B stripes of 16 blocks of 16 bytes: stripe b holds block b
 *              of lane 0, of lane 1, ... of lane 15
 *
 * A segment's lane is its id mod 16 in a group, its group's number mod
 * 16 in a run. A key sets its bits (idem__cg_mask) in block
 * idem__cg_stripe_of(B, h0) of its segment's lane.
 *
 * The file is derived from the members' key indexes and never trusted
 * unless it checks out whole and names, with the same identity (id,
 * size, time bucket, key index checksum), every cold segment of its
 * range still there. A writer builds one that does not again (a file of
 * version 2, one filter for all members, too, or of version 3, lanes of
 * 64-byte blocks); a reader goes without it
 * (each segment's own filter is asked, slower, never wrong). Members
 * gone since (dropped, oldest first) leave their lanes: never asked. */
#ifndef IDEM_COLDGROUP_H
#define IDEM_COLDGROUP_H

#include <stddef.h>
#include <stdint.h>

#include "coldfilter.h"

#define IDEM__CG_LEVELS 2u   /* 0: groups of 16 segments; 1: runs of 256 */

struct idem__log;

/* What is known of a group's filter: open checks a file's header and the
 * identities it names, not its blocks (at 3e8 keys the groups' and runs'
 * files are 1.1 GB, which a lookup of an old key reads only a block of);
 * the first lookup that would probe it checks it whole. */
enum {
    IDEM__CG_SOUND,          /* checked whole */
    IDEM__CG_UNCHECKED,      /* header checked, blocks not yet */
    IDEM__CG_DAMAGED         /* blocks do not check out: as if none */
};

typedef struct idem__cgroup {
    uint32_t num;            /* segments [num * SPAN, num * SPAN + SPAN) */
    int state;               /* IDEM__CG_SOUND, ... */
    unsigned char *img;      /* the file, mapped */
    size_t len;
    const uint64_t *blocks;
    uint64_t nblocks;
} idem__cgroup;

/* The groups of one level with a filter, by number ascending (not all
 * consecutive: one that could not be built has none). */
typedef struct idem__cgroups {
    idem__cgroup *v;
    size_t n, cap;
    uint64_t built;          /* group filters built (open or runtime) */
} idem__cgroups;

/* Segments in a group of level lv. */
static inline uint32_t idem__cg_span(unsigned lv)
{
    return lv ? 256u : 16u;
}

/* The group of level lv that segment id is in. */
static inline uint32_t idem__cg_num(uint32_t id, unsigned lv)
{
    return id / idem__cg_span(lv);
}

/* Where group num is in g, or would be: the count of g's groups
 * numbered num or lower. */
size_t idem__cgroup_find(const idem__cgroups *g, uint32_t num);

#define IDEM__CG_LANES 16u  /* members a group of either level has */
#define IDEM__CG_K 8u       /* bits a key sets in its lane's block */
/* 64-byte lines a stripe takes: 16 lanes' blocks of 16 bytes */
#define IDEM__CG_STRIPE_LINES (IDEM__CG_LANES * 16u / 64u)

/* The lane of segment id in its group of level lv: its member's place. */
static inline unsigned idem__cg_lane(uint32_t id, unsigned lv)
{
    return (unsigned)(lv ? id / idem__cg_span(0) : id) % IDEM__CG_LANES;
}

/* The stripe of a key in a filter of nstripes, from all of h0 (a
 * multiply mixes it), so that it falls apart from its block in the
 * filter in front, which comes from h0's top bits, and the two fail
 * apart. */
static inline uint64_t idem__cg_stripe_of(uint64_t nstripes, uint64_t h0)
{
    return (uint64_t)(((unsigned __int128)(h0 * 0xD6E8FEB86659FD93ull) *
                       nstripes) >> 64);
}

/* The IDEM__CG_K bits of a key in a lane's 128-bit block, 7 bits a
 * position, from a remix of h0 apart from the stripe's. */
static inline void idem__cg_mask(uint64_t h0, uint64_t m[2])
{
    uint64_t a = (h0 ^ (h0 >> 29)) * 0x94D049BB133111EBull;
    a ^= a >> 32;
    m[0] = m[1] = 0;
    for (unsigned i = 0; i < IDEM__CG_K; i++, a >>= 7)
        m[(a >> 6) & 1] |= 1ull << (a & 63);
}

/* The first word of the key's stripe in group q's filter. */
static inline const uint64_t *idem__cg_stripe(const idem__cgroup *q,
                                              uint64_t h0)
{
    uint64_t b = idem__cg_stripe_of(q->nblocks / IDEM__CG_STRIPE_LINES, h0);
    return q->blocks + 2 * IDEM__CG_LANES * b;
}

/* The lanes of group q that might hold the key whose hash's first word
 * is h0 and bits in a block are m (idem__cg_mask): bit j for lane j. */
static inline unsigned idem__cgroup_lanes(const idem__cgroup *q, uint64_t h0,
                                          const uint64_t m[2])
{
    const uint64_t *blk = idem__cg_stripe(q, h0);
    unsigned maybe = 0;
    for (unsigned j = 0; j < IDEM__CG_LANES; j++, blk += 2)
        maybe |= (unsigned)(((m[0] & ~blk[0]) | (m[1] & ~blk[1])) == 0) << j;
    return maybe;
}

/* May lookups believe q, the filter of group q->num of level lv, whose
 * cold segments are segs[lo, hi)? 1, or 0 (as if it had none). The
 * first call checks an unchecked filter whole; one that does not check
 * out is built again in its place by a writer, and passed over by a
 * reader. */
int idem__cgroup_usable(struct idem__log *lg, unsigned lv, idem__cgroup *q,
                        size_t lo, size_t hi);

/* The newest cold segment just went cold: if it is the last of its
 * group (or run), build that filter (a failure leaves the group without
 * one: slower lookups, never wrong ones). */
void idem__cgroup_went_cold(struct idem__log *lg);

/* At open, after the cold segments are loaded: map the filter of every
 * group and run whose last segment is cold, building again (a writer)
 * the ones missing or not to be trusted. */
void idem__cgroup_open(struct idem__log *lg);

/* The oldest segment, id, is about to drop: when it is the last of its
 * group (or run) still there, that filter goes with it. */
void idem__cgroup_gone(struct idem__log *lg, uint32_t id);

/* Does the filter of group num of level lv, if there is one, check out
 * whole, or is it one of an older layout, which open builds again?
 * (check/repair; name receives its file name.) */
int idem__cgroup_file_sound(int dirfd, unsigned lv, uint32_t num, char *name,
                            size_t n);

/* Let go of both levels, g[0] and g[1]. */
void idem__cgroup_free(idem__cgroups *g);

#endif
