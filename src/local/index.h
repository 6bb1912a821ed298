/* index.h - the in-memory index of the log engine: key hash -> newest
 * record.
 *
 * An entry holds only what decides "is there a live record, and where is
 * it": the key's 128-bit keyed hash, its expiry and the location of its
 * newest frame. Everything else (state, token, lease, fingerprint, the
 * response) is read from that frame, which sits in the page cache or in
 * the append buffer. That keeps an entry at 32 bytes; with the slot table
 * the index costs 42 to 52 bytes of RAM per live key.
 *
 * Odds: keys are told apart by a 128-bit XXH3 hash keyed with a random
 * secret chosen when the store was created, so nobody can aim collisions
 * at it. Among n keys the chance that any two share a hash is about
 * n^2 / 2^129: 1.5e-25 for ten million keys. A collision is still caught
 * whenever the frame is read back (its full key is compared) and reported
 * as IDEM_ECOLLISION instead of a wrong answer. */
#ifndef IDEM_INDEX_H
#define IDEM_INDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct idem__ient {
    uint64_t h[2];     /* keyed hash of the key */
    int64_t expires;   /* ms: absent at and after */
    uint32_t seg;      /* segment id of the newest frame; FREE if unused */
    uint32_t off;      /* its offset in the segment (or free-list link) */
} idem__ient;

/* What the RAM figures (README, docs/internals.md) are made of. */
_Static_assert(sizeof(idem__ient) == 32, "an index entry is 32 bytes");

#define IDEM__IENT_FREE UINT32_MAX

typedef struct idem__index {
    uint64_t *slots;   /* 0 empty, else (tag << 32) | (entry id + 1) */
    size_t mask;       /* slot count - 1 (a power of two) */
    size_t count;      /* entries in use */
    idem__ient **chunks;  /* entries, IDEM__CHUNK per chunk */
    size_t nchunks;
    uint32_t hw;       /* entry ids below this have been handed out */
    uint32_t free_head;   /* free list through ->off; UINT32_MAX = empty */
} idem__index;

void idem__index_init(idem__index *ix);
void idem__index_free(idem__index *ix);

/* Make sure `more` inserts will not allocate. 0 or IDEM_ENOMEM. */
int idem__index_reserve(idem__index *ix, size_t more);

/* Size the slot table for n keys now, so that loading them rehashes
 * nothing. 0 or IDEM_ENOMEM. */
int idem__index_presize(idem__index *ix, size_t n);

/* The entry with hash h, or NULL. */
idem__ient *idem__index_find(const idem__index *ix, const uint64_t h[2]);

/* Start loading what a find of h will touch: stage 0 the slot, stage 1
 * (once the slot is likely cached) the entry it names. Batch lookups call
 * both over a window of keys before the finds, so that the cache misses
 * of many keys overlap instead of queueing. */
void idem__index_prefetch(const idem__index *ix, const uint64_t h[2],
                          int stage);

/* Add an entry for h (not present; room reserved). Fields other than h
 * are zero. Never fails. */
idem__ient *idem__index_insert(idem__index *ix, const uint64_t h[2]);

/* Remove e, which is in the index. */
void idem__index_remove(idem__index *ix, idem__ient *e);

/* Remove the entry with id `id`, which is in use (walks know the id;
 * finding it from the pointer costs a look through the chunks). */
void idem__index_remove_id(idem__index *ix, uint32_t id);

/* Remove the entry of the key whose hash begins with h0, if it points
 * at (seg, off): what a key index entry (cold.h) knows of a key. A key
 * going cold is found from its own segment's list, not by a walk over
 * the whole index; (seg, off) tells it from another key sharing those 64
 * bits, since no two entries point at one frame. 1 if removed, 0 if no
 * entry matched. */
int idem__index_remove_at(idem__index *ix, uint64_t h0, uint32_t seg,
                          uint32_t off);

/* The entry with id `id` (< ix->hw); its seg is IDEM__IENT_FREE when
 * unused. For walks over the whole index. */
idem__ient *idem__index_at(const idem__index *ix, uint32_t id);

/* Bytes of RAM the index holds. */
size_t idem__index_bytes(const idem__index *ix);

#endif
