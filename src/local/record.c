/* record.c - encode and decode log frames (layout in record.h).
 *
 * The decoder is the gatekeeper for everything read back from disk. It
 * trusts nothing: lengths are checked against what is readable before the
 * checksum is computed, sizes against the limits the writer enforces, and
 * only then are fields used. XXH3-64 is the checksum because it runs near
 * memory speed (reopening a store means checksumming all of it) and
 * detects the torn and garbled writes we care about; it is not a defence
 * against a malicious disk. */
#include "record.h"

#include <string.h>
#include <xxhash.h>

/* Bytes of a frame of a header of hdr bytes. */
static size_t idem__size_with(size_t hdr, size_t keylen, size_t vallen)
{
    return (hdr + keylen + vallen + 7) & ~(size_t)7;
}

static int idem__fits32(int64_t a, int64_t b)
{
    __int128 d = (__int128)a - b;
    return d >= INT32_MIN && d <= INT32_MAX;
}

/* The flags of r's version 3 frame: the optional fields it needs. */
static unsigned idem__v3_flags(const idem__rec *r, size_t vallen)
{
    unsigned f = (r->has_fp ? IDEM__RF_FP : 0) |
                 (r->released ? IDEM__RF_RELEASED : 0) |
                 (vallen ? IDEM__RF_VAL : 0) |
                 (r->attempts > 0xffffu ? IDEM__RF_ATT32 : 0) |
                 (idem__fits32(r->expires, r->created) ? 0 : IDEM__RF_EXP64);
    if (r->lease)
        f |= idem__fits32(r->lease, r->created) ? IDEM__RF_LEASE
                                                : IDEM__RF_LEASE64;
    return f;
}

/* Bytes of the optional fields that flags name. */
static size_t idem__v3_extra(unsigned f)
{
    return (f & IDEM__RF_ATT32 ? 4u : 0) + (f & IDEM__RF_EXP64 ? 8u : 0) +
           (f & IDEM__RF_LEASE ? 4u : 0) + (f & IDEM__RF_LEASE64 ? 8u : 0) +
           (f & IDEM__RF_VAL ? 4u : 0) + (f & IDEM__RF_FP ? IDEM_FP_LEN : 0);
}

size_t idem__frame_size(const idem__rec *r, size_t keylen, size_t vallen)
{
    return idem__size_with(
        IDEM__REC_HDR3 + idem__v3_extra(idem__v3_flags(r, vallen)), keylen,
        vallen);
}

/* A COMMIT's created is an offset in its segment and its expires 0: its
 * ttl fits in 32 bits up to 2 GiB, past which it carries EXP64. */
const size_t idem__commit_sizes[] = {IDEM__REC_HDR3, IDEM__REC_HDR3 + 8,
                                     IDEM__REC_HDR2, IDEM__REC_HDR1, 0};

static void idem__put16(unsigned char *p, uint16_t v)
{
    memcpy(p, &v, 2);
}

static void idem__put32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void idem__put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
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

/* Write the optional fields flags name at q; returns where they end. */
static unsigned char *idem__v3_put(unsigned char *q, unsigned f,
                                   const idem__rec *r, size_t vallen)
{
    if (f & IDEM__RF_ATT32)
        idem__put32(q, r->attempts), q += 4;
    if (f & IDEM__RF_EXP64)
        idem__put64(q, (uint64_t)r->expires), q += 8;
    if (f & IDEM__RF_LEASE)
        idem__put32(q, (uint32_t)(int32_t)(r->lease - r->created)), q += 4;
    if (f & IDEM__RF_LEASE64)
        idem__put64(q, (uint64_t)r->lease), q += 8;
    if (f & IDEM__RF_VAL)
        idem__put32(q, (uint32_t)vallen), q += 4;
    if (f & IDEM__RF_FP)
        memcpy(q, r->fp, IDEM_FP_LEN), q += IDEM_FP_LEN;
    return q;
}

void idem__frame_encode(unsigned char *dst, uint8_t type, const idem__rec *r,
                        const void *key, size_t keylen, const void *val,
                        size_t vallen)
{
    unsigned f = idem__v3_flags(r, vallen);
    size_t len = idem__frame_size(r, keylen, vallen);
    idem__put32(dst + 8, (uint32_t)len);
    dst[12] = IDEM__REC_VERSION;
    dst[13] = type;
    dst[14] = r->state;
    dst[15] = (uint8_t)f;
    idem__put16(dst + 16, (uint16_t)keylen);
    idem__put16(dst + 18, (uint16_t)r->attempts);
    idem__put64(dst + 20, (uint64_t)r->created);
    idem__put32(dst + 28, f & IDEM__RF_EXP64
                              ? 0
                              : (uint32_t)(int32_t)(r->expires - r->created));
    idem__put64(dst + 32, r->token);
    unsigned char *q = idem__v3_put(dst + IDEM__REC_HDR3, f, r, vallen);
    if (keylen)
        memcpy(q, key, keylen);
    if (vallen)
        memcpy(q + keylen, val, vallen);
    memset(q + keylen + vallen, 0, len - (size_t)(q - dst) - keylen - vallen);
    idem__put64(dst, XXH3_64bits(dst + 8, len - 8));
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
           idem__size_with(hdr, keylen, vallen) == len;
}

/* Where a frame's fields are, by version: its header's size, key and
 * value lengths. 0, or IDEM_ECORRUPT when they cannot be (checked before
 * the checksum). */
typedef struct idem__shape {
    size_t hdr;
    uint32_t keylen, vallen;
} idem__shape;

static int idem__shape_of(const unsigned char *p, size_t avail,
                          idem__shape *sh)
{
    if (p[12] != 1 && p[12] != 2) {  /* 3, or unknown: measured as 3 */
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
        return p[12] == IDEM__REC_VERSION && f >= 128 ? IDEM_ECORRUPT : 0;
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

int idem__frame_decode(const unsigned char *p, size_t avail, idem__frame *f,
                       int verify)
{
    idem__shape sh;
    if (avail < IDEM__REC_HDR || idem__shape_of(p, avail, &sh))
        return IDEM_ECORRUPT;
    uint32_t len = idem__get32(p + 8);
    if (!idem__sizes_sane(sh.hdr, len, sh.keylen, sh.vallen) || len > avail)
        return IDEM_ECORRUPT;
    if (verify && XXH3_64bits(p + 8, len - 8) != idem__get64(p))
        return IDEM_ECORRUPT;
    if (p[12] == 0 || p[12] > IDEM__REC_VERSION)
        return IDEM_EVERSION;
    if (p[13] == 0 || p[13] >= IDEM__R_MAX_ || p[14] > IDEM_STATE_FAILED)
        return IDEM_ECORRUPT;
    f->type = p[13];
    f->len = len;
    f->rec.state = p[14];
    f->rec.has_fp = (p[15] & IDEM__RF_FP) != 0;
    f->rec.released = (p[15] & IDEM__RF_RELEASED) != 0;
    if (p[12] == IDEM__REC_VERSION)
        idem__decode_v3(p, &f->rec);
    else
        idem__decode_v12(p, &f->rec);
    f->key = p + sh.hdr;
    f->keylen = sh.keylen;
    f->val = p + sh.hdr + sh.keylen;
    f->vallen = sh.vallen;
    return 0;
}
