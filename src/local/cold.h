/* cold.h - the key index and Bloom filter beside a cold segment.
 *
 * A store larger than its RAM budget keeps only its newest keys in the
 * in-memory index (index.h). The keys of an older, sealed segment leave
 * RAM once a file beside it, seg-00000001.kix, holds:
 *
 *   off  size  field
 *     0     8  magic "IDEMKIX"
 *     8     4  version (2)
 *    12     4  segment id
 *    16     8  segment size: the file it was built from, byte for byte
 *    24     8  segment created (its header's time bucket)
 *    32     8  entries (distinct keys)
 *    40     8  filter blocks (64 bytes each)
 *    48     8  newest expiry of any record in the segment
 *    56     8  greatest token of any frame in the segment
 *    64     8  key frames in the segment
 *    72     4  checkpoint frames
 *    76     4  bits set per key in the filter (k)
 *    80     8  XXH3-64 of the body
 *    88    32  reserved (0)
 *   120     8  XXH3-64 of bytes [0, 120)
 *   128        body: the filter; the entries' hashes (8 bytes each);
 *              their frames' offsets (4 bytes each); the checkpoint
 *              offsets (4 bytes each); zeros to a multiple of 8 bytes
 *
 * An entry is 12 bytes: the first 64 bits of the key's keyed hash and
 * the offset of the key's newest frame in the segment; entries are
 * sorted by hash. The hashes and the offsets are two arrays, so a binary
 * search reads eight hashes a cache line. 64 bits tell a segment's keys
 * apart but for a chance of n^2 / 2^65 (1e-10 at 65 k keys); a lookup
 * compares the frame's full key, so two keys sharing them cost a read,
 * never an answer. Version 1 kept 32 more bits of the hash a key (16
 * bytes an entry); at 3e8 keys those bits were 1.2 GB of disk, and a
 * version 1 file is built again from its segment, like any file that
 * does not check out. The filter is a blocked Bloom filter: a key sets k
 * bits in one 64-byte block, so a probe costs one cache line, at 24 bits
 * a key (3 bytes; 5e-5 false positives).
 *
 * The file is derived data: it is built from the segment alone (every
 * key, its newest frame there) and checked whole when loaded; one that
 * does not check out, or that was built from another version of the
 * segment, is built again, never trusted. */
#ifndef IDEM_COLD_H
#define IDEM_COLD_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "dir.h"

#define IDEM__KIX_HDR 128u

typedef struct idem__cold {
    unsigned char *img;      /* the whole file: mapped, or heap */
    size_t len;
    int heap;                /* img is malloc'ed (a reader's rebuild) */
    const uint64_t *blocks;  /* filter: nblocks * 8 words */
    uint64_t nblocks;
    const uint64_t *h0s;     /* entry i: its key's hash, first 64 bits */
    const uint32_t *offs;    /* and its newest frame in the segment */
    uint64_t nents;
    const uint32_t *ckpts;   /* offsets of the checkpoint frames */
    uint32_t nckpts;
    int64_t max_expires;
    uint64_t max_token;
    uint64_t records;
    uint64_t body;           /* XXH3-64 of the body: which build it is */
    int unchecked;           /* loaded lazily: the header checks out,
                              * the body is not yet known to */
} idem__cold;

/* The keyed 128-bit hash every index of the store uses (inline: the
 * RAM index hashes every key of every call with it). */
static inline void idem__key_hash(const unsigned char *secret,
                                  const void *key, size_t len, uint64_t h[2])
{
    XXH128_hash_t x =
        XXH3_128bits_withSecret(key, len, secret, IDEM__SECRET_LEN);
    h[0] = x.low64;
    h[1] = x.high64;
}

/* Might the segment hold a frame of the key whose hash is h? */
int idem__cold_maybe(const idem__cold *c, const uint64_t h[2]);

/* The same question put to many segments: the key's bits in a block,
 * worked out once (a lookup asks every cold segment). */
typedef struct idem__probe {
    uint64_t h[2];
    uint64_t mask[8];
} idem__probe;

void idem__probe_init(idem__probe *p, const uint64_t h[2]);
int idem__cold_has(const idem__cold *c, const idem__probe *p);

/* Start loading the filter block a probe of h will read: a lookup asks
 * every cold segment, and the loads overlap when started together. */
void idem__cold_prefetch(const idem__cold *c, const uint64_t h[2]);

/* The first entry whose h0 is not below h[0] (nents if none). */
uint64_t idem__cold_lower(const idem__cold *c, const uint64_t h[2]);

/* The file name beside segment id: "seg-00000001.kix". */
void idem__kix_name(char *buf, size_t n, uint32_t id);

/* What a segment is, for binding its index to it. */
typedef struct idem__segid {
    uint32_t id;
    uint64_t size;
    int64_t created;
    const unsigned char *base;   /* its bytes [0, size) */
} idem__segid;

/* Load PATH/seg-N.kix into *c (mapped) if it is whole and was built
 * from sg. 0; IDEM_ENOTFOUND (none); IDEM_ECORRUPT (it does not check
 * out or is stale); IDEM_EIO/IDEM_ENOMEM. lazy: only its header is
 * checked now (c->unchecked is set); nothing of its body may be used
 * before idem__cold_check says it checks out. At 3e8 keys the bodies
 * are 5.7 GB, and a claim of a new key reads none of them. */
int idem__cold_load(int dirfd, const idem__segid *sg, idem__cold *c,
                    int lazy);

/* XXH3-64 of bytes [from, len) of a file mapped whole at map, read in
 * bulk: the page tables are filled in one call, where each page touched
 * would fault (and a fault on a virtual machine may cost a trip through
 * its hypervisor); on a kernel before 5.14 the pages are read ahead. */
uint64_t idem__mapped_sum(void *map, size_t len, size_t from);

/* Does the body of c, loaded lazily, check out? 1 (c->unchecked is then
 * clear) or 0: it must be built again from its segment. */
int idem__cold_check(idem__cold *c);

/* Build the index of segment sg into *c (heap) and, with write, write
 * it as PATH/seg-N.kix, durably (temporary file, fsync, rename,
 * directory fsync). Touches no store, so a thread of its own may call it
 * (coldjob.h). 0; IDEM_ENOMEM; IDEM_ECORRUPT (a frame does not check
 * out); IDEM_EIO with *werr the errno of the write that failed. *c holds
 * nothing on failure. */
int idem__cold_produce(int dirfd, const idem__segid *sg,
                       const unsigned char *secret, int write,
                       idem__cold *c, int *werr);

/* Word idem__cold_produce()'s failure rc (werr) for segment id of the
 * store at path as s's error, and return rc. */
int idem__cold_explain(idem_store *s, const char *path, uint32_t id, int rc,
                       int werr);

/* Serve the index just written from the file's pages, which the kernel
 * may evict, rather than from the heap copy in *c, which it may not; the
 * body is known (it was just built), so it is not read to be checked.
 * The heap copy stays when the file cannot be mapped. */
void idem__cold_adopt(int dirfd, const idem__segid *sg, idem__cold *c);

/* Produce, word a failure, and adopt, in one go; with write == 0 (a
 * reader) the heap copy is kept. */
int idem__cold_make(idem_store *s, int dirfd, const char *path,
                    const idem__segid *sg, const unsigned char *secret,
                    int write, idem__cold *c);

void idem__cold_free(idem__cold *c);

/* RAM the filter and index of c hold while mapped (they are file pages,
 * evictable; counted for the stats). */
size_t idem__cold_bytes(const idem__cold *c);

#endif
