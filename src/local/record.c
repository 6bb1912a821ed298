/* record.c - encode and decode log frames (layout in record.h).
 *
 * The decoder is the gatekeeper for everything read back from disk. It
 * trusts nothing: lengths are checked against what is readable before the
 * checksum is computed, sizes against the limits the writer enforces, and
 * only then are fields used. XXH3-64 is the checksum (its low 32 bits
 * from version 4, where 4 bytes a frame are 5 % of the disk) because it
 * runs near memory speed (reopening a store means checksumming all of it)
 * and detects the torn and garbled writes we care about; it is not a
 * defence against a malicious disk.
 *
 * Version 5 frames are written; every earlier version is still read, by
 * the version byte at offset 12 that all of them share. */
#include "record.h"

#include <string.h>
#include <xxhash.h>

/* Bytes of a frame of a header of hdr bytes, padded to a multiple of
 * align (8 up to version 3, 4 from version 4). */
static size_t idem__size_with(size_t hdr, size_t keylen, size_t vallen,
                              size_t align)
{
    return (hdr + keylen + vallen + align - 1) & ~(align - 1);
}

/* Bytes of the version 3 optional fields that flags name. */
static size_t idem__v3_extra(unsigned f)
{
    return (f & IDEM__RF_ATT32 ? 4u : 0) + (f & IDEM__RF_EXP64 ? 8u : 0) +
           (f & IDEM__RF_LEASE ? 4u : 0) + (f & IDEM__RF_LEASE64 ? 8u : 0) +
           (f & IDEM__RF_VAL ? 4u : 0) + (f & IDEM__RF_FP ? IDEM_FP_LEN : 0);
}

static void idem__put32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static uint16_t idem__get16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static uint32_t idem__get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t idem__get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ------------------------------------------------------------------------
 * Version 4: the fields as a byte stream of varints (record.h). All
 * arithmetic on times is done in uint64_t, wrapping, so that encode and
 * decode are exact inverses for every value and a crafted frame that
 * passes its checksum decodes to nonsense, never to undefined behaviour. */

static inline size_t idem__varint_put(unsigned char *q, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        q[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    q[n++] = (unsigned char)v;
    return n;
}

/* The units a time difference may be counted in, by their 2-bit code in
 * the flags: ms, s, min, h. TTLs and leases are mostly whole seconds,
 * minutes or hours (a TTL of a day is 24 hours: one byte). */
static const uint64_t idem__units[4] = {1, 1000, 60000, 3600000};

/* A signed ms difference as a zigzag varint, in the largest unit that
 * divides it; its code goes into *f at bit `at` (f NULL: in ms). The
 * divisors are constants so that no division is a division. */
static size_t idem__delta_put(unsigned char *q, uint64_t d, unsigned *f,
                              unsigned at)
{
    int64_t v = (int64_t)d;
    unsigned u = !f                  ? 0
                 : v % 3600000 == 0 ? 3
                 : v % 60000 == 0   ? 2
                 : v % 1000 == 0    ? 1
                                    : 0;
    v = u == 3 ? v / 3600000 : u == 2 ? v / 60000 : u == 1 ? v / 1000 : v;
    if (f)
        *f |= u << at;
    return idem__varint_put(q, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

/* The field stream of r into st (IDEM__V4_STREAM bytes at most, zero
 * padded to 8); returns its length, which alone sizes the frame. The
 * token is stored as its difference from created in microseconds: a
 * claim's token is the clock then, or above it by as far as claims have
 * run ahead of the clock (record.h). */
static size_t idem__v5_stream(unsigned char *st, uint8_t type,
                              const idem__rec *r, size_t keylen,
                              size_t vallen)
{
    unsigned f = (r->has_fp ? IDEM__R4_FP : 0) |
                 (r->released ? IDEM__R4_RELEASED : 0) |
                 (r->lease ? IDEM__R4_LEASE : 0) |
                 (vallen ? IDEM__R4_VAL : 0);
    uint64_t created = (uint64_t)r->created;
    uint64_t ahead = r->token - created * 1000;
    unsigned kind = type | (unsigned)r->state << 4 |
                    (r->attempts == 1 ? IDEM__K4_ATT1 : 0) |
                    (ahead == 0 ? IDEM__K4_NODIFF : 0);
    size_t n = 2;
    st[0] = (unsigned char)kind;
    n += idem__varint_put(st + n, keylen);
    if (!(kind & IDEM__K4_ATT1))
        n += idem__varint_put(st + n, r->attempts);
    n += idem__varint_put(st + n, created);
    if (ahead)
        n += idem__delta_put(st + n, ahead, NULL, 0);
    n += idem__delta_put(st + n, (uint64_t)r->expires - created, &f,
                         IDEM__R4_TTL_UNIT);
    if (r->lease)
        n += idem__delta_put(st + n, (uint64_t)r->lease - created, &f,
                             IDEM__R4_LEASE_UNIT);
    if (vallen)
        n += idem__varint_put(st + n, vallen);
    if (r->has_fp)
        memcpy(st + n, r->fp, IDEM_FP_LEN), n += IDEM_FP_LEN;
    st[1] = (unsigned char)f;
    for (; n < 8; n++)
        st[n] = 0;
    return n;
}

size_t idem__frame_plan(idem__fplan *p, uint8_t type, const idem__rec *r,
                        const void *key, size_t keylen, const void *val,
                        size_t vallen)
{
    p->n = idem__v5_stream(p->st, type, r, keylen, vallen);
    p->len = idem__size_with(5 + p->n, keylen, vallen, 4);
    p->key = key;
    p->keylen = keylen;
    p->val = val;
    p->vallen = vallen;
    return p->len;
}

/* A COMMIT's created is an offset in its segment, below 4 GiB, its token
 * and expires 0: in version 5 three varints of 1 to 5, 7 and 5 bytes
 * (version 4: two of 1 to 5). Then the sizes of earlier versions. */
const size_t idem__commit_sizes[] = {16, 20, 24, 28, IDEM__REC_HDR3,
                                     IDEM__REC_HDR3 + 8, IDEM__REC_HDR2,
                                     IDEM__REC_HDR1, 0};

void idem__frame_write(unsigned char *dst, const idem__fplan *p)
{
    const size_t n = p->n, len = p->len;
    memcpy(dst + 4, p->st, 8);
    dst[12] = IDEM__REC_VERSION;
    memcpy(dst + 13, p->st + 8, n - 8);
    unsigned char *q = dst + 5 + n;
    if (p->keylen)
        memcpy(q, p->key, p->keylen);
    if (p->vallen)
        memcpy(q + p->keylen, p->val, p->vallen);
    memset(q + p->keylen + p->vallen, 0, len - (5 + n) - p->keylen - p->vallen);
    idem__put32(dst, (uint32_t)XXH3_64bits(dst + 4, len - 4));
}

/* A version 4 field stream being read in place: n of its bytes are
 * readable at p, `at` is the read position; `bad` once a field ran past
 * them. */
typedef struct idem__v4r {
    const unsigned char *p;
    size_t n, at;
    int bad;
} idem__v4r;

/* The next byte of the stream: byte i is at 4 + i in the frame, past the
 * version byte at 12 from i = 8 on. */
static inline unsigned char idem__v4_byte(idem__v4r *r)
{
    if (r->at >= r->n) {
        r->bad = 1;
        return 0;
    }
    size_t i = r->at++;
    return r->p[i < 8 ? 4 + i : 5 + i];
}

static inline uint64_t idem__varint_get(idem__v4r *r)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        unsigned char b = idem__v4_byte(r);
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80)
            return v;
    }
    r->bad = 1;  /* over 10 bytes: no encoder wrote it */
    return 0;
}

/* A difference idem__delta_put wrote, in ms (unit: its code). */
static uint64_t idem__delta_get(idem__v4r *r, unsigned unit)
{
    uint64_t u = idem__varint_get(r);
    return ((u >> 1) ^ (0 - (u & 1))) * idem__units[unit & 3];
}

/* Start reading the field stream of the version 4 frame at p, of which
 * `avail` bytes are readable (at least 13), past its kind and flags. */
static void idem__v4_start(const unsigned char *p, size_t avail,
                           idem__v4r *r)
{
    r->p = p;
    r->n = avail - 5 < IDEM__V4_STREAM ? avail - 5 : IDEM__V4_STREAM;
    r->at = 2;
    r->bad = 0;
}

/* Are the sizes in a header of hdr bytes possible at all? Checked before
 * the checksum so that a garbled length cannot make us hash past the
 * buffer. */
static int idem__sizes_sane(size_t hdr, uint32_t len, uint32_t keylen,
                            uint32_t vallen)
{
    return len >= hdr && len % 8 == 0 &&
           keylen <= IDEM_CHECKPOINT_NAME_MAX + IDEM_KEY_MAX &&
           vallen <= IDEM_VALUE_MAX &&
           idem__size_with(hdr, keylen, vallen, 8) == len;
}

/* Where a version 1 to 3 frame's fields are: its header's size, key and
 * value lengths. 0, or IDEM_ECORRUPT when they cannot be (checked before
 * the checksum). */
typedef struct idem__shape {
    size_t hdr;
    uint32_t keylen, vallen;
} idem__shape;

static int idem__shape_of(const unsigned char *p, size_t avail,
                          idem__shape *sh)
{
    if (p[12] != 1 && p[12] != 2) {  /* 3, or 0: measured as 3 */
        unsigned f = p[15];
        sh->hdr = IDEM__REC_HDR3 + idem__v3_extra(f);
        sh->keylen = idem__get16(p + 16);
        sh->vallen = 0;
        if (f & IDEM__RF_VAL) {
            size_t at = sh->hdr - idem__v3_extra(f & IDEM__RF_FP) - 4;
            if (sh->hdr > avail)
                return IDEM_ECORRUPT;
            sh->vallen = idem__get32(p + at);
        }
        return p[12] == 3 && f >= 128 ? IDEM_ECORRUPT : 0;
    }
    sh->hdr = p[12] == 1 ? IDEM__REC_HDR1 : IDEM__REC_HDR2;
    if (avail < sh->hdr)
        return IDEM_ECORRUPT;
    sh->keylen = idem__get32(p + 20);
    sh->vallen = idem__get32(p + 64);
    return 0;
}

/* The fields of version 1 and 2 frames. Version 1 had a 32-bit token
 * that counted the claims, so attempts is the token there. */
static void idem__decode_v12(const unsigned char *p, idem__rec *r)
{
    if (p[12] == 1) {
        r->token = idem__get32(p + 16);
        r->attempts = (uint32_t)r->token;
    } else {
        r->attempts = idem__get32(p + 16);
        r->token = idem__get64(p + 72);
    }
    r->created = (int64_t)idem__get64(p + 24);
    r->expires = (int64_t)idem__get64(p + 32);
    r->lease = (int64_t)idem__get64(p + 40);
    memcpy(r->fp, p + 48, IDEM_FP_LEN);
}

/* t plus a signed 32-bit delta, wrapping (a checksummed frame holds what
 * its writer put there; a crafted one gets nonsense, never UB). */
static int64_t idem__plus(int64_t t, uint32_t delta)
{
    return (int64_t)((uint64_t)t + (uint64_t)(int64_t)(int32_t)delta);
}

static void idem__decode_v3(const unsigned char *p, idem__rec *r)
{
    unsigned f = p[15];
    const unsigned char *q = p + IDEM__REC_HDR3;
    r->attempts = idem__get16(p + 18);
    r->created = (int64_t)idem__get64(p + 20);
    r->expires = idem__plus(r->created, idem__get32(p + 28));
    r->token = idem__get64(p + 32);
    r->lease = 0;
    memset(r->fp, 0, IDEM_FP_LEN);
    if (f & IDEM__RF_ATT32)
        r->attempts = idem__get32(q), q += 4;
    if (f & IDEM__RF_EXP64)
        r->expires = (int64_t)idem__get64(q), q += 8;
    if (f & IDEM__RF_LEASE)
        r->lease = idem__plus(r->created, idem__get32(q)), q += 4;
    if (f & IDEM__RF_LEASE64)
        r->lease = (int64_t)idem__get64(q), q += 8;
    q += f & IDEM__RF_VAL ? 4 : 0;
    if (f & IDEM__RF_FP)
        memcpy(r->fp, q, IDEM_FP_LEN);
}

/* Is (type, state) one a writer can have written? */
static int idem__kind_ok(unsigned type, unsigned state)
{
    return type != 0 && type < IDEM__R_MAX_ && state <= IDEM_STATE_FAILED;
}

/* Frames of versions 1 to 3 (and 0, which no idem wrote). */
static int idem__decode_old(const unsigned char *p, size_t avail,
                            idem__frame *f, int verify)
{
    idem__shape sh;
    if (avail < IDEM__REC_HDR3 || idem__shape_of(p, avail, &sh))
        return IDEM_ECORRUPT;
    uint32_t len = idem__get32(p + 8);
    if (!idem__sizes_sane(sh.hdr, len, sh.keylen, sh.vallen) || len > avail)
        return IDEM_ECORRUPT;
    if (verify && XXH3_64bits(p + 8, len - 8) != idem__get64(p))
        return IDEM_ECORRUPT;
    if (p[12] == 0)
        return IDEM_EVERSION;
    if (!idem__kind_ok(p[13], p[14]))
        return IDEM_ECORRUPT;
    f->type = p[13];
    f->len = len;
    f->rec.state = p[14];
    f->rec.has_fp = (p[15] & IDEM__RF_FP) != 0;
    f->rec.released = (p[15] & IDEM__RF_RELEASED) != 0;
    if (p[12] == 3)
        idem__decode_v3(p, &f->rec);
    else
        idem__decode_v12(p, &f->rec);
    f->key = p + sh.hdr;
    f->keylen = sh.keylen;
    f->val = p + sh.hdr + sh.keylen;
    f->vallen = sh.vallen;
    return 0;
}

/* The fields of a version 4 or 5 stream into rec. The two differ only
 * in what the varint after attempts and the difference after it hold:
 * version 4 the token and created from it in ms, version 5 created and
 * the token from it in microseconds. */
static void idem__v4_fields(idem__v4r *r, idem__rec *rec,
                                uint64_t *keylen, uint64_t *vallen)
{
    unsigned kind = r->p[4], fl = r->p[5];
    *keylen = idem__varint_get(r);
    rec->attempts = kind & IDEM__K4_ATT1 ? 1u
                                         : (uint32_t)idem__varint_get(r);
    uint64_t slot = idem__varint_get(r);
    uint64_t diff = kind & IDEM__K4_NODIFF ? 0 : idem__delta_get(r, 0);
    uint64_t created = r->p[12] == 4 ? slot / 1000 - diff : slot;
    rec->token = r->p[12] == 4 ? slot : slot * 1000 + diff;
    rec->created = (int64_t)created;
    rec->expires =
        (int64_t)(created + idem__delta_get(r, fl >> IDEM__R4_TTL_UNIT));
    rec->lease = fl & IDEM__R4_LEASE
                     ? (int64_t)(created + idem__delta_get(
                                               r, fl >> IDEM__R4_LEASE_UNIT))
                     : 0;
    *vallen = fl & IDEM__R4_VAL ? idem__varint_get(r) : 0;
    memset(rec->fp, 0, IDEM_FP_LEN);
    for (unsigned i = 0; fl & IDEM__R4_FP && i < IDEM_FP_LEN; i++)
        rec->fp[i] = idem__v4_byte(r);
    rec->has_fp = (fl & IDEM__R4_FP) != 0;
    rec->released = (fl & IDEM__R4_RELEASED) != 0;
}

/* Frames of versions 4 and 5, and of later versions, measured as
 * version 5. */
static int idem__decode_v4(const unsigned char *p, size_t avail,
                           idem__frame *f, int verify)
{
    idem__v4r r;
    uint64_t keylen, vallen;
    idem__v4_start(p, avail, &r);
    idem__v4_fields(&r, &f->rec, &keylen, &vallen);
    size_t hdr = 5 + (r.at < 8 ? 8 : r.at);
    if (r.bad || keylen > IDEM_CHECKPOINT_NAME_MAX + IDEM_KEY_MAX ||
        vallen > IDEM_VALUE_MAX)
        return IDEM_ECORRUPT;
    size_t len = idem__size_with(hdr, (size_t)keylen, (size_t)vallen, 4);
    if (len > avail)
        return IDEM_ECORRUPT;
    if (verify && (uint32_t)XXH3_64bits(p + 4, len - 4) != idem__get32(p))
        return IDEM_ECORRUPT;
    if (p[12] > IDEM__REC_VERSION)
        return IDEM_EVERSION;
    unsigned type = p[4] & 15u, state = (p[4] >> 4) & 3u;
    if (!idem__kind_ok(type, state))
        return IDEM_ECORRUPT;
    f->type = (uint8_t)type;
    f->len = (uint32_t)len;
    f->rec.state = (uint8_t)state;
    f->key = p + hdr;
    f->keylen = (uint32_t)keylen;
    f->val = p + hdr + keylen;
    f->vallen = (uint32_t)vallen;
    return 0;
}

int idem__frame_decode(const unsigned char *p, size_t avail, idem__frame *f,
                       int verify)
{
    if (avail < IDEM__REC_HDR)
        return IDEM_ECORRUPT;
    return p[12] >= 4 ? idem__decode_v4(p, avail, f, verify)
                                      : idem__decode_old(p, avail, f, verify);
}
