/* test_bizkey.c - prefix:id:hash against the SHA-256 and HMAC-SHA256
 * standard vectors; the character rules; hash lengths; parsing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

static idem_bizkey_gen *gen(unsigned hash_len, const void *key, size_t klen)
{
    idem_bizkey_opts o;
    idem_bizkey_opts_init(&o);
    o.hash_len = hash_len;
    o.hmac_key = key;
    o.hmac_key_len = klen;
    idem_bizkey_gen *g = NULL;
    int rc = idem_bizkey_gen_new(&o, &g);
    cr_assert_eq(rc, 0, "%s: %s", idem_strerror(rc),
                 idem_bizkey_gen_errdetail(g));
    return g;
}

/* The hash part of prefix:id:payload's key. */
static const char *hash_of(idem_bizkey_gen *g, const void *payload, size_t len)
{
    static char out[IDEM_BIZKEY_MAX + 1];
    size_t n = 0;
    int rc =
        idem_bizkey_gen_make(g, "t", "1", payload, len, out, sizeof out, &n);
    cr_assert_eq(rc, 0, "%s", idem_bizkey_gen_errdetail(g));
    cr_assert_eq(n, strlen(out));
    cr_assert_eq(memcmp(out, "t:1:", 4), 0);
    return out + 4;
}

/* FIPS 180-4 examples (and the long-message vector of FIPS 180-2). */
Test(bizkey, sha256_fips_180_4_vectors, .timeout = 30)
{
    idem_bizkey_gen *g = gen(64, NULL, 0);
    struct {
        const char *msg;
        const char *hex;
    } v[] = {
        {"abc",
         "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"",
         "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
         "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        cr_assert_str_eq(hash_of(g, v[i].msg, strlen(v[i].msg)), v[i].hex,
                         "vector %zu", i);
    cr_assert_str_eq(hash_of(g, NULL, 0), v[1].hex, "NULL, 0 is empty");
    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    cr_assert_str_eq(
        hash_of(g, million, 1000000),
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
    idem_bizkey_gen_free(g);
}

static void fill(unsigned char *p, unsigned char c, size_t n)
{
    memset(p, c, n);
}

/* RFC 4231 test cases 1-7 (case 5 is specified truncated to 128 bits). */
Test(bizkey, hmac_sha256_rfc_4231_vectors, .timeout = 30)
{
    unsigned char k1[20], k3[20], k4[25], k5[20], k6[131];
    unsigned char d3[50], d4[50];
    fill(k1, 0x0b, 20);
    fill(k3, 0xaa, 20);
    fill(d3, 0xdd, 50);
    for (int i = 0; i < 25; i++)
        k4[i] = (unsigned char)(i + 1);
    fill(d4, 0xcd, 50);
    fill(k5, 0x0c, 20);
    fill(k6, 0xaa, 131);
    const char *d6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    const char *d7 =
        "This is a test using a larger than block-size key and a larger "
        "than block-size data. The key needs to be hashed before being used "
        "by the HMAC algorithm.";
    struct {
        const void *key;
        size_t klen;
        const void *data;
        size_t dlen;
        unsigned hex_len;
        const char *hex;
    } v[] = {
        {k1, 20, "Hi There", 8, 64,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, "what do ya want for nothing?", 28, 64,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {k3, 20, d3, 50, 64,
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {k4, 25, d4, 50, 64,
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {k5, 20, "Test With Truncation", 20, 32,
         "a3b6167473100ee06e0c796c2955552b"},
        {k6, 131, d6, strlen(d6), 64,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {k6, 131, d7, strlen(d7), 64,
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        idem_bizkey_gen *g = gen(v[i].hex_len, v[i].key, v[i].klen);
        /* Twice: the keyed state is reused, not consumed. */
        for (int twice = 0; twice < 2; twice++)
            cr_assert_str_eq(hash_of(g, v[i].data, v[i].dlen), v[i].hex,
                             "RFC 4231 case %zu", i + 1);
        idem_bizkey_gen_free(g);
    }
}

Test(bizkey, hash_length_bounds, .timeout = 10)
{
    const char *full =
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    idem_bizkey_opts o;
    idem_bizkey_gen *g;
    const unsigned bad[] = {0, 1, 7, 65, 128};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        idem_bizkey_opts_init(&o);
        o.hash_len = bad[i];
        cr_assert_eq(idem_bizkey_gen_new(&o, &g), IDEM_EINVAL, "len %u",
                     bad[i]);
        cr_assert(strstr(idem_bizkey_gen_errdetail(g), "out of range 8..64"));
        char out[64];
        cr_assert_eq(
            idem_bizkey_gen_make(g, "a", "b", "", 0, out, sizeof out, NULL),
            IDEM_EINVAL, "a closed handle makes nothing");
        idem_bizkey_gen_free(g);
    }
    for (unsigned n = 8; n <= 64; n++) {
        g = gen(n, NULL, 0);
        const char *h = hash_of(g, "abc", 3);
        cr_assert_eq(strlen(h), n);
        cr_assert_eq(strncmp(h, full, n), 0, "len %u: a prefix of the hash", n);
        idem_bizkey_gen_free(g);
    }
    /* The default is 16. */
    char out[IDEM_BIZKEY_MAX + 1];
    size_t n;
    cr_assert_eq(
        idem_bizkey("order", "A-1001", "abc", 3, NULL, out, sizeof out, &n), 0);
    cr_assert_str_eq(out, "order:A-1001:ba7816bf8f01cfea");
    cr_assert_eq(n, 29u);
    /* An empty secret is refused. */
    idem_bizkey_opts_init(&o);
    o.hmac_key = "";
    o.hmac_key_len = 0;
    cr_assert_eq(idem_bizkey_gen_new(&o, &g), IDEM_EINVAL);
    idem_bizkey_gen_free(g);
    memset(&o, 0, sizeof o);
    cr_assert_eq(idem_bizkey_gen_new(&o, &g), IDEM_EINVAL, "uninitialised");
    idem_bizkey_gen_free(g);
}

static char *repeat(char c, size_t n)
{
    char *s = malloc(n + 1);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

Test(bizkey, invalid_prefixes_and_ids_rejected, .timeout = 10)
{
    char *p64 = repeat('p', 64), *p65 = repeat('p', 65);
    char *i256 = repeat('i', 256), *i257 = repeat('i', 257);
    const char *bad_prefix[] = {"",    "a:b", "a b", "{a}", "a}",
                                "-a",  ".a",  "_a",  "a\n", "caf\xc3\xa9",
                                "a/b", "a@b", "a\t", "a*",  p65};
    const char *good_prefix[] = {"a", "order", "refund.v2", "A_b-c", "9x", p64};
    const char *bad_id[] = {"",     "a:b", "a b", "{x}", "x\r",
                            "\x7f", "a#b", "a?b", "%41", i257};
    const char *good_id[] = {"A-1001", "x@y+z=w/v~", "2024-01-01",
                             "_",      ".",          i256};
    idem_bizkey_gen *g = gen(16, NULL, 0);
    char out[IDEM_BIZKEY_MAX + 1], why[256];
    for (size_t i = 0; i < sizeof bad_prefix / sizeof *bad_prefix; i++) {
        cr_assert_eq(idem_bizkey_gen_make(g, bad_prefix[i], "id", "x", 1, out,
                                          sizeof out, NULL),
                     IDEM_EINVAL, "prefix '%s' accepted", bad_prefix[i]);
        cr_assert(strstr(idem_bizkey_gen_errdetail(g), "prefix"), "%s",
                  idem_bizkey_gen_errdetail(g));
        why[0] = '\0';
        cr_assert_eq(idem_bizkey_check_prefix(bad_prefix[i], why, sizeof why),
                     IDEM_EINVAL);
        cr_assert_neq(why[0], '\0');
    }
    for (size_t i = 0; i < sizeof good_prefix / sizeof *good_prefix; i++) {
        cr_assert_eq(idem_bizkey_gen_make(g, good_prefix[i], "id", "x", 1, out,
                                          sizeof out, NULL),
                     0, "prefix '%s': %s", good_prefix[i],
                     idem_bizkey_gen_errdetail(g));
        cr_assert_eq(idem_bizkey_check_prefix(good_prefix[i], NULL, 0), 0);
    }
    for (size_t i = 0; i < sizeof bad_id / sizeof *bad_id; i++) {
        cr_assert_eq(idem_bizkey_gen_make(g, "p", bad_id[i], "x", 1, out,
                                          sizeof out, NULL),
                     IDEM_EINVAL, "id '%s' accepted", bad_id[i]);
        cr_assert_eq(idem_bizkey_check_id(bad_id[i], NULL, 0), IDEM_EINVAL);
    }
    for (size_t i = 0; i < sizeof good_id / sizeof *good_id; i++)
        cr_assert_eq(idem_bizkey_gen_make(g, "p", good_id[i], "x", 1, out,
                                          sizeof out, NULL),
                     0, "id '%s': %s", good_id[i],
                     idem_bizkey_gen_errdetail(g));
    /* The messages name the character. */
    cr_assert_eq(idem_bizkey_check_prefix("ord:er", why, sizeof why),
                 IDEM_EINVAL);
    cr_assert(strstr(why, "':' at offset 3"), "%s", why);
    cr_assert_eq(idem_bizkey_check_prefix(NULL, why, sizeof why), IDEM_EINVAL);
    /* The longest key fits IDEM_BIZKEY_MAX. */
    idem_bizkey_gen *g64 = gen(64, NULL, 0);
    size_t n = 0;
    cr_assert_eq(
        idem_bizkey_gen_make(g64, p64, i256, "x", 1, out, sizeof out, &n), 0);
    cr_assert_eq(n, (size_t)IDEM_BIZKEY_MAX);
    cr_assert_leq(n, (size_t)IDEM_KEY_MAX);
    idem_bizkey_gen_free(g64);
    idem_bizkey_gen_free(g);
    free(p64);
    free(p65);
    free(i256);
    free(i257);
}

Test(bizkey, output_buffer_too_small, .timeout = 10)
{
    idem_bizkey_gen *g = gen(16, NULL, 0);
    char out[64];
    memset(out, '#', sizeof out);
    size_t n = 0;
    /* "order:A-1:" + 16 = 26 chars + NUL = 27 bytes. */
    cr_assert_eq(idem_bizkey_gen_make(g, "order", "A-1", "x", 1, out, 26, &n),
                 IDEM_EINVAL);
    cr_assert_eq(n, 26u, "the length needed");
    cr_assert_eq(out[0], '#', "untouched");
    cr_assert_eq(idem_bizkey_gen_make(g, "order", "A-1", "x", 1, out, 27, &n),
                 0);
    cr_assert_eq(strlen(out), 26u);
    cr_assert_eq(idem_bizkey_gen_make(g, "order", "A-1", NULL, 1, out, 27, &n),
                 IDEM_EINVAL, "NULL payload with a length");
    idem_bizkey_gen_free(g);
}

Test(bizkey, parse, .timeout = 10)
{
    idem_bizkey_parts p;
    const char *k = "order.v2:A-1001/x:0123456789abcdef";
    cr_assert_eq(idem_bizkey_parse(k, strlen(k), &p), 0);
    cr_assert_eq(p.prefix_len, 8u);
    cr_assert_eq(strncmp(p.prefix, "order.v2", 8), 0);
    cr_assert_eq(p.id_len, 8u);
    cr_assert_eq(strncmp(p.id, "A-1001/x", 8), 0);
    cr_assert_eq(p.hash_len, 16u);
    cr_assert_eq(strncmp(p.hash, "0123456789abcdef", 16), 0);
    const char *bad[] = {
        "",
        "order",
        "order:A-1",
        "order:A-1:",
        "order:A-1:0123456",          /* 7 hex */
        "order:A-1:0123456789ABCDEF", /* uppercase */
        "order:A-1:0123456789abcdeg",
        ":A-1:0123456789abcdef",
        "order::0123456789abcdef",
        "or der:A-1:0123456789abcdef",
        "a:b:c:0123456789abcdef", /* hash "c:..." */
        "order:A-1:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(idem_bizkey_parse(bad[i], strlen(bad[i]), &p), IDEM_EINVAL,
                     "parsed '%s'", bad[i]);
}

/* 1 M keys: every one well-formed, parses back to its parts, and the
 * same payload always gives the same key. */
Test(bizkey, layout_1m, .timeout = 120)
{
    idem_bizkey_gen *g = gen(16, NULL, 0);
    unsigned char payload[200];
    memset(payload, 'x', sizeof payload);
    char out[IDEM_BIZKEY_MAX + 1], first[IDEM_BIZKEY_MAX + 1];
    for (unsigned i = 0; i < 1000000; i++) {
        memcpy(payload, &i, sizeof i);
        size_t n;
        cr_assert_eq(idem_bizkey_gen_make(g, "order", "A-1001", payload,
                                          sizeof payload, out, sizeof out, &n),
                     0);
        if (n != 29 || memcmp(out, "order:A-1001:", 13) != 0)
            cr_assert_fail("bad key %s", out);
        for (int j = 13; j < 29; j++)
            if (!((out[j] >= '0' && out[j] <= '9') ||
                  (out[j] >= 'a' && out[j] <= 'f')))
                cr_assert_fail("not lowercase hex: %s", out);
        if (i % 64 == 0) {
            idem_bizkey_parts p;
            cr_assert_eq(idem_bizkey_parse(out, n, &p), 0);
            cr_assert_eq(p.hash, out + 13);
        }
        if (i == 0)
            memcpy(first, out, n + 1);
    }
    unsigned zero = 0;
    memcpy(payload, &zero, sizeof zero);
    cr_assert_eq(idem_bizkey_gen_make(g, "order", "A-1001", payload,
                                      sizeof payload, out, sizeof out, NULL),
                 0);
    cr_assert_str_eq(out, first, "deterministic");
    idem_bizkey_gen_free(g);
}

/* A secret changes every key; the same secret gives the same keys. */
Test(bizkey, hmac_depends_on_the_secret, .timeout = 10)
{
    idem_bizkey_gen *a = gen(16, "one", 3), *b = gen(16, "two", 3),
                    *a2 = gen(16, "one", 3), *plain = gen(16, NULL, 0);
    char ha[80], hb[80], ha2[80], hp[80];
    snprintf(ha, sizeof ha, "%s", hash_of(a, "payload", 7));
    snprintf(hb, sizeof hb, "%s", hash_of(b, "payload", 7));
    snprintf(ha2, sizeof ha2, "%s", hash_of(a2, "payload", 7));
    snprintf(hp, sizeof hp, "%s", hash_of(plain, "payload", 7));
    cr_assert_str_eq(ha, ha2);
    cr_assert_str_neq(ha, hb);
    cr_assert_str_neq(ha, hp);
    idem_bizkey_gen_free(a);
    idem_bizkey_gen_free(b);
    idem_bizkey_gen_free(a2);
    idem_bizkey_gen_free(plain);
}
