/* record.h - the on-disk record format of the log engine.
 *
 * A record is a checksummed, self-sizing, versioned frame. Version 5, the
 * one written, spends its bytes where a claim needs them: at 300 M keys
 * the frames are most of the disk, and a claim of a 36-byte key takes 56
 * bytes (80 in version 3, 120 in version 2):
 *
 *   off  size  field
 *     0     4  check    low 32 bits of the XXH3-64 of bytes [4, len)
 *     4     8  stream   the first 8 bytes of the field stream below
 *    12     1  version  IDEM__REC_VERSION, where every version has it
 *    13        stream   the rest of the field stream (at least 8 bytes
 *                       in all, zero padded), then key bytes, value
 *                       bytes, zero padding to a multiple of 4
 *
 *   The field stream, varints LEB128 (7 bits a byte, low first):
 *     1  kind     type (bits 0-3) | state (4-5) | IDEM__K4_* (6, 7)
 *     1  flags    IDEM__R4_*: which fields follow, in which unit
 *     v  keylen
 *     v  attempts                 unless K4_ATT1 (attempts is 1)
 *     v  created                  ms
 *     z  token - created * 1000   unless K4_NODIFF (it is 0), in
 *                                 microseconds: a claim's token is the
 *                                 clock in microseconds, or above it as
 *                                 far as claims ran ahead of the clock
 *                                 (more than one a microsecond for a
 *                                 while): 2 bytes, 4 up to 134 s ahead
 *     z  expires - created        in the unit flags bits 4-5 name
 *     z  lease - created          R4_LEASE only (else lease is 0), in
 *                                 the unit flags bits 6-7 name
 *     v  vallen                   R4_VAL only (else 0)
 *    16  fp                       R4_FP only
 *   z: a signed difference, zigzag varint, in the largest of ms, s, min,
 *   h that divides it (a TTL of a day: 1 byte; a lease of 30 s: 1).
 *
 * The length is not stored: the stream gives it, and every field that
 * sizes the frame is bounds-checked before the checksum is computed.
 * Damage to any byte changes the checksum or the size, and a frame
 * whose check does not match does not decode: a garbled frame gets
 * through only if its 32-bit check matches by chance (odds of 2^-32),
 * after its version byte, kind and sizes already had to be possible.
 *
 * Version 4, still read, is version 5 but for two fields: the varint
 * after attempts is the token, and the difference after it (left out
 * under K4_NODIFF) is token / 1000 - created, in ms. Its frames grew by
 * up to 4 bytes once tokens ran more than 8 s ahead of the clock, which
 * a store taking over a million claims a second does within a minute.
 * Version 5 has version 4's fields in the same order under the same
 * bits, so a build that reads only version 4 measures a version 5 frame
 * right, checks it, and refuses it as of a newer version, not as damage.
 * Later versions must keep that.
 *
 * Version 3, still read, has a 40-byte header and carries only the
 * fields a record needs beyond it (most records need none, or a lease):
 *
 *   off  size  field
 *     0     8  check    XXH3-64 of bytes [8, len)
 *     8     4  len      whole frame in bytes, header included, multiple of 8
 *    12     1  version  3
 *    13     1  type     IDEM__R_*: the operation that wrote it
 *    14     1  state    idem_state after the operation
 *    15     1  flags    IDEM__RF_*: which optional fields follow
 *    16     2  keylen
 *    18     2  attempts (the low 16 bits; RF_ATT32: the field below)
 *    20     8  created  ms
 *    28     4  ttl      expires - created, signed (0 with RF_EXP64)
 *    32     8  token
 *    40        optional fields, in this order, each only if its flag is set:
 *                RF_ATT32   4  attempts
 *                RF_EXP64   8  expires
 *                RF_LEASE   4  lease - created, signed
 *                RF_LEASE64 8  lease
 *                RF_VAL     4  vallen (else 0)
 *                RF_FP     16  fp
 *              then key bytes, value bytes, zero padding to a multiple of 8
 *
 * Version 2, still read, has an 80-byte header with every field:
 *
 *   off  size  field
 *     0     8  check, 8 4 len, 12 1 version, 13 1 type, 14 1 state,
 *    15     1  flags (RF_FP, RF_RELEASED only)
 *    16     4  attempts claims granted on the record
 *    20     4  keylen
 *    24     8  created  ms
 *    32     8  expires  ms
 *    40     8  lease    ms
 *    48    16  fp
 *    64     4  vallen
 *    68     4  reserved (0)
 *    72     8  token
 *    80        key bytes, value bytes, zero padding to a multiple of 8
 *
 * Version 1, still read, has a 72-byte header: offset 16 holds a 32-bit
 * token, there is no field at 72, and attempts is the token (tokens then
 * counted claims from 1).
 *
 * Every key record is a full snapshot of the key's state, so recovery
 * needs only the newest record of each key. The sizes come before the
 * data they cover, the checksum covers them, and frames are 4-byte
 * aligned (those of versions 1 to 3 8-byte): a scanner can tell a torn or
 * garbled frame from a valid one and look for the next valid frame at
 * 4-byte steps. Integers are little-endian (the engine refuses to build
 * on big-endian hosts). */
#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the idem log format is little-endian; port record.c first"
#endif

#define IDEM__REC_VERSION 5
/* Where frames start: a multiple of this from the segment's first. */
#define IDEM__REC_ALIGN 4u
/* The most bytes a version 4 or 5 field stream can take (a reader looks at
 * no more: ten bytes for each varint, the fingerprint). */
#define IDEM__V4_STREAM 96u
/* The header of version 3, optional fields aside. */
#define IDEM__REC_HDR3 40u
/* Version 2's header, and version 1's. */
#define IDEM__REC_HDR2 80u
#define IDEM__REC_HDR1 72u
/* The smallest frame of any version (versions 4 and 5: check, version
 * byte, an 8-byte stream, padding): a scanner looking for a frame needs
 * at least this many bytes. */
#define IDEM__REC_HDR 16u

/* The layouts above, as docs/internals.md states them. */
_Static_assert(48 + IDEM_FP_LEN == 64, "v2: the fingerprint ends at vallen");
_Static_assert(IDEM__REC_HDR2 == IDEM__REC_HDR1 + 8,
               "a version 2 frame header is version 1's plus the token");
_Static_assert(IDEM__REC_HDR3 == 32 + 8, "version 3 ends with the token");

enum idem__rtype {
    IDEM__R_CLAIM = 1,
    IDEM__R_COMPLETE,
    IDEM__R_FAIL,
    IDEM__R_RELEASE,    /* retryable failure */
    IDEM__R_EXTEND,
    IDEM__R_FORGET,     /* tombstone: key only */
    IDEM__R_CHECKPOINT, /* key = name, value = blob */
    IDEM__R_COMMIT,     /* end of one group commit; no key; created is
                         * the offset where the group's first frame is
                         * (0 in stores written before it said so) */
    IDEM__R_MAX_
};

#define IDEM__RF_FP 1u
#define IDEM__RF_RELEASED 2u
#define IDEM__RF_LEASE 4u      /* version 3 on: which fields follow */
#define IDEM__RF_LEASE64 8u
#define IDEM__RF_EXP64 16u
#define IDEM__RF_ATT32 32u
#define IDEM__RF_VAL 64u

/* Bits of the kind byte of versions 4 and 5 beside type (4 bits) and
 * state (2). */
#define IDEM__K4_ATT1 64u      /* attempts is 1: no field */
#define IDEM__K4_NODIFF 128u   /* the difference of created and token
                                * is 0: no field */

/* The flags of versions 4 and 5 (a byte of their field stream). */
#define IDEM__R4_FP 1u
#define IDEM__R4_RELEASED 2u
#define IDEM__R4_LEASE 4u      /* lease - created follows */
#define IDEM__R4_VAL 8u        /* vallen follows */
/* Bits 4-5 and 6-7: the unit of expires - created and of lease -
 * created, 0 ms, 1 s, 2 min, 3 h (record.c). */
#define IDEM__R4_TTL_UNIT 4u
#define IDEM__R4_LEASE_UNIT 6u

/* A decoded frame. key/val point into the frame's bytes. */
typedef struct idem__frame {
    uint8_t type;
    uint32_t len;         /* bytes of the frame */
    idem__rec rec;
    const unsigned char *key;
    uint32_t keylen;
    const unsigned char *val;
    uint32_t vallen;
} idem__frame;

/* A frame worked out before it is written: its length first, to make
 * room for it, then its bytes, with its field stream encoded once (a
 * claim's frame is most of a claim's own work). */
typedef struct idem__fplan {
    unsigned char st[IDEM__V4_STREAM];  /* the field stream */
    size_t n;                           /* bytes of st used */
    size_t len;                         /* of the frame */
    const void *key, *val;
    size_t keylen, vallen;
} idem__fplan;

/* Plan into *p the frame of type for record r, key and value (which
 * must stay valid until idem__frame_write()). Returns its length. */
size_t idem__frame_plan(idem__fplan *p, uint8_t type, const idem__rec *r,
                        const void *key, size_t keylen, const void *val,
                        size_t vallen);

/* The sizes a COMMIT frame written by any version may have, 0 ended
 * (log_check.c looks for one at a segment's end). */
extern const size_t idem__commit_sizes[];

/* Write the frame p planned into dst, which has p->len bytes. */
void idem__frame_write(unsigned char *dst, const idem__fplan *p);

/* Decode the frame at p with `avail` bytes readable. Returns 0, or
 * IDEM_ECORRUPT when no valid frame starts there (torn, garbled, or not a
 * frame), or IDEM_EVERSION for a valid frame of an unknown version.
 * verify = 0 skips the checksum: for frames this process wrote or
 * already verified while recovering. */
int idem__frame_decode(const unsigned char *p, size_t avail, idem__frame *f,
                       int verify);

#endif
