/* test_fingerprint.c - the 128-bit payload digest: known answers, byte
 * order, sensitivity. */
#include <criterion/criterion.h>
#include <string.h>
#include <xxhash.h>

#include "idem/idem.h"

static const char *hex(const uint8_t fp[IDEM_FP_LEN])
{
    static char s[2 * IDEM_FP_LEN + 1];
    idem_fingerprint_hex(fp, s);
    return s;
}

Test(fingerprint, known_answers, .timeout = 10)
{
    uint8_t fp[IDEM_FP_LEN];
    /* XXH3-128 of the empty input, from the xxHash reference. */
    idem_fingerprint("", 0, fp);
    cr_assert_str_eq(hex(fp), "99aa06d3014798d86001c324468d497f");
    idem_fingerprint(NULL, 0, fp);
    cr_assert_str_eq(hex(fp), "99aa06d3014798d86001c324468d497f");
    /* SHA-256("abc") truncated to 16 bytes (FIPS 180-4). */
    cr_assert_eq(idem_fingerprint_sha256("abc", 3, fp), 0);
    cr_assert_str_eq(hex(fp), "ba7816bf8f01cfea414140de5dae2223");
    cr_assert_eq(idem_fingerprint_sha256(NULL, 0, fp), 0);
    cr_assert_str_eq(hex(fp), "e3b0c44298fc1c149afbf4c8996fb924");
}

/* The stored bytes are high64 then low64, each big-endian: the same on
 * every machine. */
Test(fingerprint, canonical_byte_order, .timeout = 10)
{
    const char *msg = "{\"order\":\"A-1001\",\"amount\":42}";
    uint8_t fp[IDEM_FP_LEN];
    idem_fingerprint(msg, strlen(msg), fp);
    XXH128_hash_t h = XXH3_128bits(msg, strlen(msg));
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(fp[i], (uint8_t)(h.high64 >> (56 - 8 * i)));
        cr_assert_eq(fp[8 + i], (uint8_t)(h.low64 >> (56 - 8 * i)));
    }
}

/* Any one-bit change of the payload changes the fingerprint. */
Test(fingerprint, every_bit_matters, .timeout = 30)
{
    unsigned char p[300];
    for (size_t i = 0; i < sizeof p; i++)
        p[i] = (unsigned char)(i * 31 + 7);
    uint8_t base[IDEM_FP_LEN], fp[IDEM_FP_LEN], again[IDEM_FP_LEN];
    idem_fingerprint(p, sizeof p, base);
    idem_fingerprint(p, sizeof p, again);
    cr_assert_eq(memcmp(base, again, IDEM_FP_LEN), 0, "deterministic");
    for (size_t bit = 0; bit < 8 * sizeof p; bit++) {
        p[bit / 8] ^= (unsigned char)(1u << bit % 8);
        idem_fingerprint(p, sizeof p, fp);
        cr_assert_neq(memcmp(base, fp, IDEM_FP_LEN), 0, "bit %zu", bit);
        cr_assert_eq(idem_fingerprint_sha256(p, sizeof p, fp), 0);
        p[bit / 8] ^= (unsigned char)(1u << bit % 8);
    }
    /* Length matters too: a prefix is another payload. */
    idem_fingerprint(p, sizeof p - 1, fp);
    cr_assert_neq(memcmp(base, fp, IDEM_FP_LEN), 0);
}
