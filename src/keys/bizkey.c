/* bizkey.c - keys derived from the message: prefix:id:hash.
 *
 * When a producer sends no key, every consumer must derive the same one
 * from what it receives, and a different one for every other operation.
 * The business ID alone is rarely enough (one order, several updates), the
 * payload alone is unreadable in logs and useless to an operator; the key
 * carries both: a readable "order:A-1001" and a digest of the exact bytes.
 *
 * The digest is SHA-256, or HMAC-SHA256 when the keys must not be
 * computable by outsiders, through OpenSSL's libcrypto: a vetted
 * implementation with CPU-specific assembly (SHA extensions, AVX2), so a
 * key costs little more than hashing the payload once. A generator holds
 * the fetched digest and the keyed HMAC state, because in OpenSSL 3 the
 * fetch and the key schedule cost more than hashing a small payload.
 *
 * The characters allowed in prefix and id are few on purpose: no ':' so
 * that a key splits back into its parts, no braces so that it can sit in
 * a Redis Cluster hash tag, nothing that a shell, a log line or a URL
 * would need to quote. */
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define IDEM__BIZKEY_OPTS_VERSION 1u

struct idem_bizkey_gen {
    int closed;
    unsigned hash_len;
    EVP_MD *md; /* SHA-256, fetched once */
    EVP_MD_CTX *mdctx;
    EVP_MAC *mac;        /* with a secret: HMAC */
    EVP_MAC_CTX *macctx; /* keyed; re-initialised per key */
    char detail[256];
};

static int idem__bk_fail(idem_bizkey_gen *g, int code, const char *fmt, ...)
    IDEM__PRINTF(3, 4);

static int idem__bk_fail(idem_bizkey_gen *g, int code, const char *fmt, ...)
{
    if (!g)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->detail, sizeof g->detail, fmt, ap);
    va_end(ap);
    return code;
}

void idem_bizkey_opts_init(idem_bizkey_opts *o)
{
    memset(o, 0, sizeof *o);
    o->version = IDEM__BIZKEY_OPTS_VERSION;
    o->hash_len = IDEM_BIZKEY_HASH_DEFAULT;
}

/* ---- the character rules ----------------------------------------------- */

/* Character classes, one table lookup per byte: keys are checked on
 * every call, so this runs as often as the hash. */
enum { IDEM__ALNUM = 1, IDEM__PREFIX = 2, IDEM__ID = 4 };

static unsigned char idem__class[256];
static pthread_once_t idem__class_once = PTHREAD_ONCE_INIT;

static void idem__class_init(void)
{
    for (int c = 0; c < 256; c++) {
        unsigned char k = 0;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            (c >= '0' && c <= '9'))
            k = IDEM__ALNUM | IDEM__PREFIX | IDEM__ID;
        else if (c == '.' || c == '_' || c == '-')
            k = IDEM__PREFIX | IDEM__ID;
        else if (c == '~' || c == '@' || c == '+' || c == '=' || c == '/')
            k = IDEM__ID;
        idem__class[c] = k;
    }
}

static void idem__why(char *why, size_t whysz, const char *fmt, ...)
    IDEM__PRINTF(3, 4);

static void idem__why(char *why, size_t whysz, const char *fmt, ...)
{
    if (!why || !whysz)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whysz, fmt, ap);
    va_end(ap);
}

/* Check s[0..len) as a prefix or an id; what names it in messages. */
static int idem__check_part(const char *what, const char *s, size_t len,
                            int is_prefix, char *why, size_t whysz)
{
    size_t max = is_prefix ? IDEM_BIZKEY_PREFIX_MAX : IDEM_BIZKEY_ID_MAX;
    unsigned char cls = is_prefix ? IDEM__PREFIX : IDEM__ID;
    pthread_once(&idem__class_once, idem__class_init);
    const char *allowed =
        is_prefix ? "A-Z a-z 0-9 . _ -" : "A-Z a-z 0-9 . _ - ~ @ + = /";
    if (len == 0) {
        idem__why(why, whysz, "%s is empty", what);
        return IDEM_EINVAL;
    }
    if (len > max) {
        idem__why(why, whysz, "%s is longer than %zu bytes", what, max);
        return IDEM_EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (idem__class[c] & cls)
            continue;
        if (c > 0x20 && c < 0x7f)
            idem__why(why, whysz,
                      "%s \"%.*s\": character '%c' at offset %zu is not "
                      "allowed; use only %s",
                      what, (int)(len < 48 ? len : 48), s, c, i, allowed);
        else
            idem__why(why, whysz,
                      "%s: byte 0x%02x at offset %zu is not allowed (no "
                      "spaces, control or non-ASCII characters); use only %s",
                      what, c, i, allowed);
        return IDEM_EINVAL;
    }
    if (is_prefix && !(idem__class[(unsigned char)s[0]] & IDEM__ALNUM)) {
        idem__why(why, whysz, "%s \"%.*s\" must start with a letter or digit",
                  what, (int)(len < 48 ? len : 48), s);
        return IDEM_EINVAL;
    }
    return 0;
}

int idem_bizkey_check_prefix(const char *prefix, char *why, size_t whysz)
{
    if (!prefix) {
        idem__why(why, whysz, "prefix is missing");
        return IDEM_EINVAL;
    }
    return idem__check_part("prefix", prefix,
                            strnlen(prefix, IDEM_BIZKEY_PREFIX_MAX + 1), 1, why,
                            whysz);
}

int idem_bizkey_check_id(const char *id, char *why, size_t whysz)
{
    if (!id) {
        idem__why(why, whysz, "id is missing");
        return IDEM_EINVAL;
    }
    return idem__check_part("id", id, strnlen(id, IDEM_BIZKEY_ID_MAX + 1), 0,
                            why, whysz);
}

/* ---- the generator ----------------------------------------------------- */

int idem_bizkey_gen_new(const idem_bizkey_opts *opts, idem_bizkey_gen **out)
{
    idem_bizkey_opts def;
    if (!out)
        return IDEM_EINVAL;
    if (!opts) {
        idem_bizkey_opts_init(&def);
        opts = &def;
    }
    idem_bizkey_gen *g = calloc(1, sizeof *g);
    *out = g;
    if (!g)
        return IDEM_ENOMEM;
    g->closed = 1;
    if (opts->version != IDEM__BIZKEY_OPTS_VERSION)
        return idem__bk_fail(g, IDEM_EINVAL,
                             "options not initialised with "
                             "idem_bizkey_opts_init()");
    if (opts->hash_len < IDEM_BIZKEY_HASH_MIN ||
        opts->hash_len > IDEM_BIZKEY_HASH_MAX)
        return idem__bk_fail(
            g, IDEM_EINVAL, "hash length %u is out of range %u..%u",
            opts->hash_len, IDEM_BIZKEY_HASH_MIN, IDEM_BIZKEY_HASH_MAX);
    if (opts->hmac_key && !opts->hmac_key_len)
        return idem__bk_fail(g, IDEM_EINVAL, "the HMAC secret is empty");
    g->hash_len = opts->hash_len;
    if (opts->hmac_key) {
        char digest[] = "SHA256";
        OSSL_PARAM params[] = {
            OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
            OSSL_PARAM_construct_end(),
        };
        g->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        g->macctx = g->mac ? EVP_MAC_CTX_new(g->mac) : NULL;
        if (!g->macctx || !EVP_MAC_init(g->macctx, opts->hmac_key,
                                        opts->hmac_key_len, params))
            return idem__bk_fail(g, IDEM_EIO,
                                 "OpenSSL cannot provide HMAC-SHA256");
    } else {
        g->md = EVP_MD_fetch(NULL, "SHA256", NULL);
        g->mdctx = g->md ? EVP_MD_CTX_new() : NULL;
        if (!g->mdctx)
            return idem__bk_fail(g, IDEM_EIO, "OpenSSL cannot provide SHA-256");
    }
    g->closed = 0;
    return 0;
}

void idem_bizkey_gen_free(idem_bizkey_gen *g)
{
    if (!g)
        return;
    /* EVP_MAC_CTX_free() cleanses the key schedule it holds. */
    EVP_MAC_CTX_free(g->macctx);
    EVP_MAC_free(g->mac);
    EVP_MD_CTX_free(g->mdctx);
    EVP_MD_free(g->md);
    free(g);
}

const char *idem_bizkey_gen_errdetail(const idem_bizkey_gen *g)
{
    return g ? g->detail : "out of memory";
}

static int idem__digest(idem_bizkey_gen *g, const void *payload, size_t len,
                        unsigned char md[32])
{
    static const char empty[1];
    const void *p = len ? payload : empty;
    if (g->macctx) {
        size_t n = 0;
        /* NULL key: start again from the key schedule set at new(). */
        if (!EVP_MAC_init(g->macctx, NULL, 0, NULL) ||
            !EVP_MAC_update(g->macctx, p, len) ||
            !EVP_MAC_final(g->macctx, md, &n, 32) || n != 32)
            return idem__bk_fail(g, IDEM_EIO, "OpenSSL HMAC-SHA256 failed");
        return 0;
    }
    unsigned int n = 0;
    if (!EVP_DigestInit_ex2(g->mdctx, g->md, NULL) ||
        !EVP_DigestUpdate(g->mdctx, p, len) ||
        !EVP_DigestFinal_ex(g->mdctx, md, &n) || n != 32)
        return idem__bk_fail(g, IDEM_EIO, "OpenSSL SHA-256 failed");
    return 0;
}

int idem_bizkey_gen_make(idem_bizkey_gen *g, const char *prefix,
                         const char *id, const void *payload, size_t len,
                         char *out, size_t outsz, size_t *outlen)
{
    static const char hex[] = "0123456789abcdef";
    if (!g)
        return IDEM_EINVAL;
    g->detail[0] = '\0';
    if (g->closed)
        return idem__bk_fail(g, IDEM_EINVAL,
                             "generator is in a closed "
                             "state: idem_bizkey_gen_new() "
                             "failed");
    if (!payload && len)
        return idem__bk_fail(g, IDEM_EINVAL, "payload is NULL");
    if (!prefix || !id)
        return idem__bk_fail(g, IDEM_EINVAL, "%s is missing",
                             prefix ? "id" : "prefix");
    size_t plen = strnlen(prefix, IDEM_BIZKEY_PREFIX_MAX + 1);
    size_t ilen = strnlen(id, IDEM_BIZKEY_ID_MAX + 1);
    int rc = idem__check_part("prefix", prefix, plen, 1, g->detail,
                              sizeof g->detail);
    if (!rc)
        rc = idem__check_part("id", id, ilen, 0, g->detail, sizeof g->detail);
    if (rc)
        return rc;
    size_t need = plen + 1 + ilen + 1 + g->hash_len;
    if (outlen)
        *outlen = need;
    if (!out || outsz < need + 1)
        return idem__bk_fail(g, IDEM_EINVAL,
                             "output buffer of %zu bytes is too small; the "
                             "key needs %zu and a NUL",
                             outsz, need);
    unsigned char md[32];
    rc = idem__digest(g, payload, len, md);
    if (rc)
        return rc;
    char *p = out;
    memcpy(p, prefix, plen);
    p += plen;
    *p++ = ':';
    memcpy(p, id, ilen);
    p += ilen;
    *p++ = ':';
    for (unsigned i = 0; i < g->hash_len; i++) {
        unsigned b = md[i / 2];
        *p++ = hex[i % 2 ? b & 0x0f : b >> 4];
    }
    *p = '\0';
    return 0;
}

int idem_bizkey(const char *prefix, const char *id, const void *payload,
                size_t len, const idem_bizkey_opts *opts, char *out,
                size_t outsz, size_t *outlen)
{
    idem_bizkey_gen *g;
    int rc = idem_bizkey_gen_new(opts, &g);
    if (!rc)
        rc = idem_bizkey_gen_make(g, prefix, id, payload, len, out, outsz,
                                  outlen);
    idem_bizkey_gen_free(g);
    return rc;
}

/* ---- decoding ---------------------------------------------------------- */

int idem_bizkey_parse(const char *key, size_t len, idem_bizkey_parts *out)
{
    if (!key || !out)
        return IDEM_EINVAL;
    const char *c1 = memchr(key, ':', len);
    if (!c1)
        return IDEM_EINVAL;
    size_t rest = len - (size_t)(c1 + 1 - key);
    const char *c2 = memchr(c1 + 1, ':', rest);
    if (!c2)
        return IDEM_EINVAL;
    idem_bizkey_parts p = {
        .prefix = key,
        .prefix_len = (size_t)(c1 - key),
        .id = c1 + 1,
        .id_len = (size_t)(c2 - c1 - 1),
        .hash = c2 + 1,
        .hash_len = len - (size_t)(c2 + 1 - key),
    };
    if (idem__check_part("prefix", p.prefix, p.prefix_len, 1, NULL, 0) ||
        idem__check_part("id", p.id, p.id_len, 0, NULL, 0))
        return IDEM_EINVAL;
    if (p.hash_len < IDEM_BIZKEY_HASH_MIN || p.hash_len > IDEM_BIZKEY_HASH_MAX)
        return IDEM_EINVAL;
    for (size_t i = 0; i < p.hash_len; i++) {
        char h = p.hash[i];
        if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f')))
            return IDEM_EINVAL;
    }
    *out = p;
    return 0;
}
