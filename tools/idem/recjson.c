/* recjson.c - the NDJSON form of a record, shared by get, dump and load.
 *
 *   {"key":"k1","state":"done","token":1700000000000000,"attempts":1,
 *    "created_ms":...,"expires_ms":...,"response":"..."}
 *
 * Keys and values are bytes: valid UTF-8 goes out as a JSON string, the
 * rest as base64 under "key_base64" / "response_base64", so a dump never
 * loses a byte and `idem load` restores exactly what was stored. Times
 * are Unix milliseconds, as the store keeps them; get also prints them
 * readable. Optional fields: "released" (a PENDING record after a
 * retryable failure), "lease_until_ms" (PENDING), "fingerprint" (hex).
 * "response" holds a DONE record's response or a FAILED one's error.
 * Dumps made before tokens were taken from the clock have no "attempts":
 * their tokens counted the claims, so a token that fits in 32 bits is
 * read as the attempts too. */
#include "recjson.h"

#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_tree.h>

static const char *const states[] = {"pending", "done", "failed"};

static int bytes_field(cli_buf *b, const char *name, const void *p,
                       size_t n)
{
    int text = utf8_valid(p, n);
    int rc = buf_fmt(b, "\"%s%s\":", name, text ? "" : "_base64");
    return rc ? rc : text ? buf_json_string(b, p, n) : buf_base64(b, p, n);
}

int rec_to_json(cli_buf *b, const void *key, size_t keylen,
                const idem_record *r)
{
    int rc = buf_str(b, "{") || bytes_field(b, "key", key, keylen);
    rc = rc ? rc : buf_fmt(b, ",\"state\":\"%s\",\"token\":%llu,"
                          "\"attempts\":%u,"
                          "\"created_ms\":%lld,\"expires_ms\":%lld",
                          states[r->state], (unsigned long long)r->token,
                          r->attempts, (long long)r->created_ms,
                          (long long)r->expires_ms);
    if (r->state == IDEM_PENDING)
        rc = rc ? rc : buf_fmt(b, ",\"lease_until_ms\":%lld%s",
                              (long long)r->lease_until,
                              r->released ? ",\"released\":true" : "");
    if (r->has_fp) {
        rc = rc ? rc : buf_str(b, ",\"fingerprint\":\"");
        for (int i = 0; !rc && i < IDEM_FP_LEN; i++)
            rc = buf_fmt(b, "%02x", r->fp[i]);
        rc = rc ? rc : buf_str(b, "\"");
    }
    if (r->len)
        rc = rc ? rc : buf_str(b, ",") ||
                       bytes_field(b, "response", r->data, r->len);
    return rc ? rc : buf_str(b, "}\n");
}

/* ------------------------------------------------------------------------
 * Reading it back */

static yajl_val field(yajl_val obj, const char *name)
{
    const char *path[] = {name, NULL};
    return yajl_tree_get(obj, path, yajl_t_any);
}

/* A text or base64 field into scratch; offset and length returned. */
static int bytes_in(yajl_val obj, const char *name, cli_buf *scratch,
                    size_t *off, size_t *n, char *err, size_t errlen)
{
    char b64name[64];
    snprintf(b64name, sizeof b64name, "%s_base64", name);
    yajl_val t = field(obj, name), b = field(obj, b64name);
    *off = scratch->len;
    *n = 0;
    if (t && YAJL_IS_STRING(t)) {
        *n = strlen(t->u.string);
        return buf_add(scratch, t->u.string, *n);
    }
    if (!b)
        return t ? (snprintf(err, errlen, "\"%s\" is not a string", name),
                    -1)
                 : 0;
    const char *s = YAJL_IS_STRING(b) ? b->u.string : "";
    size_t sl = strlen(s);
    if (buf_reserve(scratch, sl))
        return -1;
    long got = base64_decode(s, sl, (unsigned char *)scratch->p + *off);
    if (got < 0) {
        snprintf(err, errlen, "\"%s\" is not base64", b64name);
        return -1;
    }
    *n = (size_t)got;
    scratch->len += *n;
    return 0;
}

static int64_t num(yajl_val obj, const char *name, int *ok)
{
    yajl_val v = field(obj, name);
    if (!v)
        return 0;
    if (!YAJL_IS_INTEGER(v))
        *ok = 0;
    return YAJL_IS_INTEGER(v) ? YAJL_GET_INTEGER(v) : 0;
}

/* "attempts", or for an older dump without it the token it counted. */
static uint32_t parse_attempts(yajl_val obj, uint64_t token, int *ok)
{
    if (!field(obj, "attempts"))
        return token <= UINT32_MAX ? (uint32_t)token : 1;
    int64_t n = num(obj, "attempts", ok);
    if (n < 1 || n > UINT32_MAX)
        *ok = 0;
    return (uint32_t)n;
}

static int parse_state(yajl_val obj, idem_record *r, char *err,
                       size_t errlen)
{
    yajl_val st = field(obj, "state");
    for (int i = 0; st && YAJL_IS_STRING(st) && i < 3; i++)
        if (!strcmp(st->u.string, states[i])) {
            r->state = (idem_state)i;
            return 0;
        }
    snprintf(err, errlen, "\"state\" must be pending, done or failed");
    return -1;
}

static int parse_fp(yajl_val obj, idem_record *r, char *err, size_t errlen)
{
    yajl_val fp = field(obj, "fingerprint");
    if (!fp)
        return 0;
    const char *s = YAJL_IS_STRING(fp) ? fp->u.string : "";
    for (int i = 0; strlen(s) == 2 * IDEM_FP_LEN && i < IDEM_FP_LEN; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            break;
        r->fp[i] = (uint8_t)v;
        r->has_fp = i == IDEM_FP_LEN - 1;
    }
    if (!r->has_fp)
        snprintf(err, errlen, "\"fingerprint\" must be %d hex digits",
                 2 * IDEM_FP_LEN);
    return r->has_fp ? 0 : -1;
}

int rec_from_json(const char *line, size_t len, cli_buf *scratch,
                  const void **key, size_t *keylen, idem_record *r,
                  char *err, size_t errlen)
{
    char *text = malloc(len + 1);
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(text, line, len);
    text[len] = '\0';
    char yerr[200] = "";
    yajl_val obj = yajl_tree_parse(text, yerr, sizeof yerr);
    free(text);
    memset(r, 0, sizeof *r);
    scratch->len = 0;
    size_t koff, doff;
    int rc = -1, ok = 1;
    if (!obj || !YAJL_IS_OBJECT(obj))
        snprintf(err, errlen, "not a JSON object%s%s", *yerr ? ": " : "",
                 yerr);
    else if (!bytes_in(obj, "key", scratch, &koff, keylen, err, errlen) &&
             !bytes_in(obj, "response", scratch, &doff, &r->len, err,
                       errlen) &&
             !parse_state(obj, r, err, errlen) &&
             !parse_fp(obj, r, err, errlen))
        rc = 0;
    if (!rc) {
        r->token = (uint64_t)num(obj, "token", &ok);
        r->attempts = parse_attempts(obj, r->token, &ok);
        r->created_ms = num(obj, "created_ms", &ok);
        r->expires_ms = num(obj, "expires_ms", &ok);
        r->lease_until = num(obj, "lease_until_ms", &ok);
        yajl_val rel = field(obj, "released");
        r->released = rel && YAJL_IS_TRUE(rel);
        *key = scratch->p + koff;
        r->data = r->len ? scratch->p + doff : NULL;
        if (!ok || !*keylen) {
            snprintf(err, errlen, !*keylen ? "no \"key\"" :
                     "token, attempts and the *_ms fields must be whole "
                     "numbers (attempts from 1)");
            rc = -1;
        }
    }
    yajl_tree_free(obj);
    return rc;
}
