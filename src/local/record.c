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

size_t idem__frame_size(size_t keylen, size_t vallen)
{
    return idem__size_with(IDEM__REC_HDR2, keylen, vallen);
}

static void idem__put32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void idem__put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
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

void idem__frame_encode(unsigned char *dst, uint8_t type, const idem__rec *r,
                        const void *key, size_t keylen, const void *val,
                        size_t vallen)
{
    size_t len = idem__frame_size(keylen, vallen);
    idem__put32(dst + 8, (uint32_t)len);
    dst[12] = IDEM__REC_VERSION;
    dst[13] = type;
    dst[14] = r->state;
    dst[15] = (uint8_t)((r->has_fp ? IDEM__RF_FP : 0) |
                        (r->released ? IDEM__RF_RELEASED : 0));
    idem__put32(dst + 16, r->attempts);
    idem__put32(dst + 20, (uint32_t)keylen);
    idem__put64(dst + 24, (uint64_t)r->created);
    idem__put64(dst + 32, (uint64_t)r->expires);
    idem__put64(dst + 40, (uint64_t)r->lease);
    memcpy(dst + 48, r->fp, IDEM_FP_LEN);
    idem__put32(dst + 64, (uint32_t)vallen);
    idem__put32(dst + 68, 0);
    idem__put64(dst + 72, r->token);
    if (keylen)
        memcpy(dst + IDEM__REC_HDR2, key, keylen);
    if (vallen)
        memcpy(dst + IDEM__REC_HDR2 + keylen, val, vallen);
    memset(dst + IDEM__REC_HDR2 + keylen + vallen, 0,
           len - IDEM__REC_HDR2 - keylen - vallen);
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

/* The fields that differ between versions: version 1 had a 32-bit token
 * that counted the claims, so attempts is the token there. */
static void idem__decode_token(const unsigned char *p, idem__rec *r)
{
    if (p[12] == 1) {
        r->token = idem__get32(p + 16);
        r->attempts = (uint32_t)r->token;
    } else {
        r->attempts = idem__get32(p + 16);
        r->token = idem__get64(p + 72);
    }
}

int idem__frame_decode(const unsigned char *p, size_t avail, idem__frame *f,
                       int verify)
{
    if (avail < IDEM__REC_HDR)
        return IDEM_ECORRUPT;
    /* A frame of an unknown version is measured as the newest known: its
     * checksum still tells a valid frame (EVERSION) from damage. */
    size_t hdr = p[12] == 1 ? IDEM__REC_HDR : IDEM__REC_HDR2;
    uint32_t len = idem__get32(p + 8), keylen = idem__get32(p + 20),
             vallen = idem__get32(p + 64);
    if (!idem__sizes_sane(hdr, len, keylen, vallen) || len > avail)
        return IDEM_ECORRUPT;
    if (verify && XXH3_64bits(p + 8, len - 8) != idem__get64(p))
        return IDEM_ECORRUPT;
    if (p[12] != 1 && p[12] != IDEM__REC_VERSION)
        return IDEM_EVERSION;
    if (p[13] == 0 || p[13] >= IDEM__R_MAX_ || p[14] > IDEM_STATE_FAILED)
        return IDEM_ECORRUPT;
    f->type = p[13];
    f->len = len;
    f->rec.state = p[14];
    f->rec.has_fp = (p[15] & IDEM__RF_FP) != 0;
    f->rec.released = (p[15] & IDEM__RF_RELEASED) != 0;
    idem__decode_token(p, &f->rec);
    f->rec.created = (int64_t)idem__get64(p + 24);
    f->rec.expires = (int64_t)idem__get64(p + 32);
    f->rec.lease = (int64_t)idem__get64(p + 40);
    memcpy(f->rec.fp, p + 48, IDEM_FP_LEN);
    f->key = p + hdr;
    f->keylen = keylen;
    f->val = p + hdr + keylen;
    f->vallen = vallen;
    return 0;
}
