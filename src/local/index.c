/* index.c - an open-addressing hash table over a dense entry arena.
 *
 * Why two arrays: entries live in fixed chunks that never move, so the
 * arena grows without a doubling's slack (a 2x realloc would cost up to
 * 64 bytes per key on its own). The slot table that points into it is the
 * only part that doubles, and at 8 bytes a slot that slack is cheap. Each
 * slot carries 32 bits of the hash besides the entry id, so a probe
 * touches the entry only when those bits already match.
 *
 * Invariants:
 *  - linear probing with no tombstones: removal shifts later members of
 *    the probe run back (Knuth's algorithm R), so lookups stop at the
 *    first empty slot;
 *  - load <= 7/8 of the slots;
 *  - an entry id is in exactly one place: a slot, or the free list. */
#include "index.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "idem/idem.h"

#define IDEM__CHUNK_BITS 16
#define IDEM__CHUNK (1u << IDEM__CHUNK_BITS)
#define IDEM__NOFREE UINT32_MAX

/* Big arrays go on 2 MiB-aligned memory marked for transparent huge
 * pages: a ten-million-key index then costs a few hundred page faults
 * instead of a hundred thousand, which is most of the time a reopen
 * takes on a virtual machine. */
#define IDEM__HUGE (2u << 20)

static void *idem__big_alloc(size_t n, int zero)
{
    if (n < IDEM__HUGE)
        return zero ? calloc(1, n) : malloc(n);
    size_t len = (n + IDEM__HUGE - 1) & ~(size_t)(IDEM__HUGE - 1);
    void *p = aligned_alloc(IDEM__HUGE, len);
    if (!p)
        return NULL;
    madvise(p, len, MADV_HUGEPAGE);  /* a hint; failure is harmless */
    if (zero)
        memset(p, 0, len);
    return p;
}

void idem__index_init(idem__index *ix)
{
    memset(ix, 0, sizeof *ix);
    ix->free_head = IDEM__NOFREE;
}

void idem__index_free(idem__index *ix)
{
    for (size_t i = 0; i < ix->nchunks; i++)
        free(ix->chunks[i]);
    free(ix->chunks);
    free(ix->slots);
    idem__index_init(ix);
}

idem__ient *idem__index_at(const idem__index *ix, uint32_t id)
{
    return &ix->chunks[id >> IDEM__CHUNK_BITS][id & (IDEM__CHUNK - 1)];
}

/* The slot's copy of the hash. The home slot is taken from the same 32
 * bits, so that growing the table re-places slots without touching the
 * entries (tables stay below 2^32 slots). */
static uint32_t idem__tag(const uint64_t h[2])
{
    return (uint32_t)(h[0] >> 32);
}

static size_t idem__home(const idem__index *ix, const uint64_t h[2])
{
    return (size_t)idem__tag(h) & ix->mask;
}

/* Put a slot value into the first free slot of its run. */
static void idem__place(uint64_t *slots, size_t mask, uint64_t value)
{
    size_t i = (size_t)(value >> 32) & mask;
    while (slots[i])
        i = (i + 1) & mask;
    slots[i] = value;
}

static int idem__grow_slots(idem__index *ix, size_t want)
{
    size_t n = ix->slots ? ix->mask + 1 : 1024;
    while (want > n - n / 8)
        n *= 2;
    if (ix->slots && n == ix->mask + 1)
        return 0;
    uint64_t *slots = idem__big_alloc(n * sizeof *slots, 1);
    if (!slots)
        return IDEM_ENOMEM;
    for (size_t i = 0; ix->slots && i <= ix->mask; i++)
        if (ix->slots[i])
            idem__place(slots, n - 1, ix->slots[i]);
    free(ix->slots);
    ix->slots = slots;
    ix->mask = n - 1;
    return 0;
}

/* Entry ids available without allocating a chunk: never handed out, plus
 * those on the free list. */
static size_t idem__spare_ids(const idem__index *ix)
{
    return ix->nchunks * IDEM__CHUNK - ix->hw + (ix->hw - ix->count);
}

static int idem__grow_chunks(idem__index *ix, size_t more)
{
    while (idem__spare_ids(ix) < more) {
        if (ix->nchunks >= (UINT32_MAX >> IDEM__CHUNK_BITS))
            return IDEM_ENOMEM;
        idem__ient **c = realloc(ix->chunks,
                                 (ix->nchunks + 1) * sizeof *ix->chunks);
        if (!c)
            return IDEM_ENOMEM;
        ix->chunks = c;
        c[ix->nchunks] = idem__big_alloc(IDEM__CHUNK * sizeof(idem__ient), 0);
        if (!c[ix->nchunks])
            return IDEM_ENOMEM;
        ix->nchunks++;
    }
    return 0;
}

int idem__index_reserve(idem__index *ix, size_t more)
{
    int rc = idem__grow_chunks(ix, more);
    return rc ? rc : idem__grow_slots(ix, ix->count + more);
}

int idem__index_presize(idem__index *ix, size_t n)
{
    return idem__grow_slots(ix, n);
}

idem__ient *idem__index_find(const idem__index *ix, const uint64_t h[2])
{
    if (!ix->slots)
        return NULL;
    uint64_t tag = (uint64_t)idem__tag(h) << 32;
    for (size_t i = idem__home(ix, h);; i = (i + 1) & ix->mask) {
        uint64_t s = ix->slots[i];
        if (!s)
            return NULL;
        if ((s & 0xffffffff00000000u) == tag) {
            idem__ient *e =
                idem__index_at(ix, (uint32_t)(s & 0xffffffffu) - 1);
            if (e->h[0] == h[0] && e->h[1] == h[1])
                return e;
        }
    }
}

void idem__index_prefetch(const idem__index *ix, const uint64_t h[2],
                          int stage)
{
    if (!ix->slots)
        return;
    const uint64_t *slot = &ix->slots[idem__home(ix, h)];
    if (stage == 0) {
        __builtin_prefetch(slot);
        return;
    }
    uint64_t s = *slot;
    if (s && (uint32_t)(s >> 32) == idem__tag(h))
        __builtin_prefetch(idem__index_at(ix, (uint32_t)(s & 0xffffffffu) - 1));
}

idem__ient *idem__index_insert(idem__index *ix, const uint64_t h[2])
{
    uint32_t id;
    if (ix->free_head != IDEM__NOFREE) {
        id = ix->free_head;
        ix->free_head = idem__index_at(ix, id)->off;
        /* Freed entries are spread over the whole index: load the next
         * while this claim goes on, not when the next one needs it. */
        if (ix->free_head != IDEM__NOFREE)
            __builtin_prefetch(idem__index_at(ix, ix->free_head), 1);
    } else {
        id = ix->hw++;
    }
    idem__ient *e = idem__index_at(ix, id);
    memset(e, 0, sizeof *e);
    e->h[0] = h[0];
    e->h[1] = h[1];
    idem__place(ix->slots, ix->mask,
                ((uint64_t)idem__tag(h) << 32) | ((uint64_t)id + 1));
    ix->count++;
    return e;
}

static uint32_t idem__id_of(const idem__index *ix, const idem__ient *e)
{
    for (size_t c = 0;; c++) {
        const idem__ient *base = ix->chunks[c];
        if (e >= base && e < base + IDEM__CHUNK)
            return (uint32_t)((c << IDEM__CHUNK_BITS) + (size_t)(e - base));
    }
}

void idem__index_remove(idem__index *ix, idem__ient *e)
{
    idem__index_remove_id(ix, idem__id_of(ix, e));
}

/* Empty slot i, which names entry id, and free the entry. */
static void idem__unslot(idem__index *ix, size_t i, uint32_t id)
{
    idem__ient *e = idem__index_at(ix, id);
    /* Shift back later members of the run whose home is not in (i, j]. */
    for (size_t j = (i + 1) & ix->mask; ix->slots[j]; j = (j + 1) & ix->mask) {
        size_t home = (size_t)(ix->slots[j] >> 32) & ix->mask;
        int between =
            i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            ix->slots[i] = ix->slots[j];
            i = j;
        }
    }
    ix->slots[i] = 0;
    e->seg = IDEM__IENT_FREE;
    e->off = ix->free_head;
    ix->free_head = id;
    ix->count--;
}

void idem__index_remove_id(idem__index *ix, uint32_t id)
{
    size_t i = idem__home(ix, idem__index_at(ix, id)->h);
    while ((uint32_t)(ix->slots[i] & 0xffffffffu) != id + 1)
        i = (i + 1) & ix->mask;
    idem__unslot(ix, i, id);
}

int idem__index_remove_at(idem__index *ix, uint64_t h0, uint32_t seg,
                          uint32_t off)
{
    if (!ix->slots)
        return 0;
    uint64_t h[2] = {h0, 0};
    uint64_t tag = (uint64_t)idem__tag(h) << 32;
    for (size_t i = idem__home(ix, h); ix->slots[i]; i = (i + 1) & ix->mask) {
        if ((ix->slots[i] & 0xffffffff00000000u) != tag)
            continue;
        uint32_t id = (uint32_t)(ix->slots[i] & 0xffffffffu) - 1;
        const idem__ient *e = idem__index_at(ix, id);
        if (e->h[0] == h0 && e->seg == seg && e->off == off) {
            idem__unslot(ix, i, id);
            return 1;
        }
    }
    return 0;
}

size_t idem__index_bytes(const idem__index *ix)
{
    return (ix->slots ? (ix->mask + 1) * sizeof(uint64_t) : 0) +
           ix->nchunks * (IDEM__CHUNK * sizeof(idem__ient) + sizeof(void *));
}
