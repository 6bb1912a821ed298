/* fingerprint.c - a 128-bit digest of a payload, to catch reused keys.
 *
 * A key reused for a different payload is a producer bug that would
 * otherwise go unnoticed: the second message gets the first one's response
 * and its own work never runs. Storing a digest of the payload with the
 * claim turns that into an explicit MISMATCH.
 *
 * The digest runs for every message, so it must cost next to nothing:
 * XXH3-128, at memory speed. 128 bits make an accidental match as likely
 * as a cosmic ray flipping the right bits. For payloads crafted by an
 * adversary a cryptographic digest is offered beside it, truncated to the
 * same 16 bytes so that stores need not care which one produced it. */
#include <openssl/evp.h>
#include <string.h>
#include <xxhash.h>

#include "common.h"

void idem_fingerprint(const void *payload, size_t len, uint8_t out[IDEM_FP_LEN])
{
    static const char empty[1];
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(len ? payload : empty, len));
    memcpy(out, c.digest, IDEM_FP_LEN);
}

int idem_fingerprint_sha256(const void *payload, size_t len,
                            uint8_t out[IDEM_FP_LEN])
{
    static const char empty[1];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!out || (len && !payload))
        return IDEM_EINVAL;
    if (!EVP_Digest(len ? payload : empty, len, md, &mdlen, EVP_sha256(),
                    NULL) ||
        mdlen < IDEM_FP_LEN)
        return IDEM_EIO;
    memcpy(out, md, IDEM_FP_LEN);
    return 0;
}

void idem_fingerprint_hex(const uint8_t fp[IDEM_FP_LEN],
                          char out[2 * IDEM_FP_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < IDEM_FP_LEN; i++) {
        out[2 * i] = hex[fp[i] >> 4];
        out[2 * i + 1] = hex[fp[i] & 0x0f];
    }
    out[2 * IDEM_FP_LEN] = '\0';
}
