/* recjson.c - the NDJSON form of a record, shared by get, dump and load.
 *
 *   {"key":"k1","state":"done","token":1700000000000000,"attempts":1,
 *    "created_ms":...,"expires_ms":...,"response":"..."}
 *
 * Keys and values are bytes: valid UTF-8 goes out as a JSON string, the
 * rest as base64 under "key_base64" / "response_base64", so a dump never
 * loses a byte and `idem load` restores exactly what was stored. Times
 * are Unix milliseconds, as the store keeps them; get also prints them
 * readable. A PENDING record adds "lease_until_ms" and, after a
 * retryable failure, "released"; a record with a payload fingerprint
 * adds "fingerprint" (32 hex digits). "response" holds a DONE record's
 * response or a FAILED one's error. "attempts" counts the claims granted;
 * dumps made before tokens were taken from the clock have none: their
 * tokens counted the claims, so a token that fits in 32 bits is read as
 * the attempts too. "key_space" names the key space of a
 * CLI job's key (keyspace.c): "key" is then the key as the job found it;
 * without it the key is in the shared key space. Reading checks all of
 * it (below). */
#include "recjson.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <yajl/yajl_parse.h>

#include "jsonkey.h"
#include "keyspace.h"

static const char *const states[] = {"pending", "done", "failed"};

int rec_to_json(cli_buf *b, const void *key, size_t keylen,
                const idem_record *r)
{
    const char *space;
    size_t spacelen;
    ks_split(key, keylen, &space, &spacelen, &key, &keylen);
    int rc = cli_buf_str(b, "{") ||
             cli_buf_bytes_member(b, "key", "key_base64", key, keylen);
    if (space)
        rc = rc ? rc : cli_buf_str(b, ",\"key_space\":") ||
                       cli_buf_json_string(b, space, spacelen);
    rc = rc ? rc : cli_buf_fmt(b, ",\"state\":\"%s\",\"token\":%llu,"
                               "\"attempts\":%u,"
                               "\"created_ms\":%lld,\"expires_ms\":%lld",
                               states[r->state], (unsigned long long)r->token,
                               r->attempts, (long long)r->created_ms,
                               (long long)r->expires_ms);
    if (r->state == IDEM_STATE_PENDING)
        rc = rc ? rc : cli_buf_fmt(b, ",\"lease_until_ms\":%lld%s",
                                   (long long)r->lease_until,
                                   r->released ? ",\"released\":true" : "");
    if (r->has_fp) {
        rc = rc ? rc : cli_buf_str(b, ",\"fingerprint\":\"");
        for (int i = 0; !rc && i < IDEM_FP_LEN; i++)
            rc = cli_buf_fmt(b, "%02x", r->fp[i]);
        rc = rc ? rc : cli_buf_str(b, "\"");
    }
    if (r->len)
        rc = rc ? rc : cli_buf_str(b, ",") ||
                       cli_buf_bytes_member(b, "response", "response_base64",
                                            r->data, r->len);
    return rc ? rc : cli_buf_str(b, "}\n");
}

/* ------------------------------------------------------------------------
 * Reading it back
 *
 * With YAJL's streaming parser, not its tree: the tree hands out strings
 * as C strings, which end at the first NUL, so a key holding "\u0000"
 * came back cut short (and two keys that differ after it came back as
 * one). The callbacks get every string with its length.
 *
 * A line is one flat object of the fields below, each at most once;
 * anything else is refused with the field's name, so that a record is
 * never imported as something other than what was dumped. A string
 * holding an escape that denotes no character ("\ud800" alone, which
 * YAJL decodes to '?') is refused too (jsonkey.h, jk_bad_escape()). */

enum {
    F_KEY, F_KEY_B64, F_STATE, F_TOKEN, F_CREATED, F_EXPIRES, F_LEASE,
    F_RELEASED, F_FP, F_RESP, F_RESP_B64, F_SPACE, F_ATTEMPTS, NFIELDS
};
enum { K_TEXT, K_BASE64, K_NUMBER, K_BOOL };

static const struct {
    const char *name;
    int kind;
} fields[NFIELDS] = {
    {"key", K_TEXT},          {"key_base64", K_BASE64},
    {"state", K_TEXT},        {"token", K_NUMBER},
    {"created_ms", K_NUMBER}, {"expires_ms", K_NUMBER},
    {"lease_until_ms", K_NUMBER}, {"released", K_BOOL},
    {"fingerprint", K_TEXT},  {"response", K_TEXT},
    {"response_base64", K_BASE64}, {"key_space", K_TEXT},
    {"attempts", K_NUMBER},
};

static const char *const kind_names[] = {
    "a string", "a base64 string", "a whole number", "true or false"};

typedef struct rec_parse {
    cli_buf *scratch;
    int depth, field;          /* field: the member being read, or -1 */
    int seen[NFIELDS];
    size_t off[NFIELDS], len[NFIELDS];  /* strings, in scratch */
    uint64_t num[NFIELDS];
    int flag;                  /* "released" */
    char *err;
    size_t errlen;
    size_t col;                /* of a syntax error, from 1; 0: none */
    const char *line;          /* the line being parsed, and its parser */
    yajl_handle h;
} rec_parse;

static int field_error(rec_parse *p, int f, const char *fmt, ...)
    CLI_PRINTF(3, 4);

/* Says `field "NAME": ...` and stops the parse (returns 0 for YAJL). */
static int field_error(rec_parse *p, int f, const char *fmt, ...)
{
    int n = snprintf(p->err, p->errlen, "field \"%s\": ", fields[f].name);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < p->errlen)
        vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return 0;
}

/* A value is starting: is it where a value of this kind may be? */
static int value_ok(rec_parse *p, int kind)
{
    if (p->depth == 0) {
        snprintf(p->err, p->errlen, "not a JSON object");
        return 0;
    }
    if (fields[p->field].kind != kind)
        return field_error(p, p->field, "must be %s",
                           kind_names[fields[p->field].kind]);
    p->seen[p->field] = 1;
    return 1;
}

static int on_key(void *ctx, const unsigned char *s, size_t n)
{
    rec_parse *p = ctx;
    for (int f = 0; f < NFIELDS; f++) {
        if (strlen(fields[f].name) != n || memcmp(fields[f].name, s, n))
            continue;
        int twin = f == F_KEY ? F_KEY_B64 : f == F_KEY_B64 ? F_KEY
                   : f == F_RESP ? F_RESP_B64 : f == F_RESP_B64 ? F_RESP
                   : f;
        if (p->seen[f] || p->seen[twin])
            return field_error(p, f, "given twice%s", twin == f ? "" :
                               " (as text and as base64)");
        p->field = f;
        return 1;
    }
    char name[48];
    size_t k = 0;
    for (; k < n && k + 1 < sizeof name; k++)
        name[k] = s[k] >= 0x20 && s[k] < 0x7f ? (char)s[k] : '?';
    name[k] = '\0';
    snprintf(p->err, p->errlen, "field \"%s\": not a field of a record",
             name);
    return 0;
}

static int hex_digit(unsigned char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The fingerprint's 32 hex digits, into scratch as 16 bytes. */
static int fp_in(rec_parse *p, const unsigned char *s, size_t n)
{
    if (n != 2 * IDEM_FP_LEN)
        return field_error(p, F_FP, "must be %d hex digits, not %zu "
                           "characters", 2 * IDEM_FP_LEN, n);
    for (size_t i = 0; i < n; i++)
        if (hex_digit(s[i]) < 0)
            return field_error(p, F_FP, "must be %d hex digits; "
                               "character %zu is not one",
                               2 * IDEM_FP_LEN, i + 1);
    for (size_t i = 0; i < n; i += 2) {
        char b = (char)(hex_digit(s[i]) << 4 | hex_digit(s[i + 1]));
        if (cli_buf_add(p->scratch, &b, 1))
            return field_error(p, F_FP, "out of memory");
    }
    return 1;
}

static int on_string(void *ctx, const unsigned char *s, size_t n)
{
    rec_parse *p = ctx;
    int f = p->field;
    int kind = f >= 0 && fields[f].kind == K_BASE64 ? K_BASE64 : K_TEXT;
    if (!value_ok(p, kind))
        return 0;
    cli_buf *b = p->scratch;
    p->off[f] = b->len;
    if (f == F_FP)
        return fp_in(p, s, n);
    size_t bad = jk_bad_escape(p->line, yajl_get_bytes_consumed(p->h) - 1);
    if (bad)
        return field_error(p, f, "\\%.5s is half of a UTF-16 surrogate "
                           "pair: it denotes no character", p->line + bad + 1);
    if (kind == K_TEXT) {
        p->len[f] = n;
        return cli_buf_add(b, s, n) ? field_error(p, f, "out of memory") : 1;
    }
    if (cli_buf_reserve(b, n))
        return field_error(p, f, "out of memory");
    long got = cli_base64_decode((const char *)s, n,
                                 (unsigned char *)b->p + b->len);
    if (got < 0)
        return field_error(p, f, "not base64");
    p->len[f] = (size_t)got;
    b->len += (size_t)got;
    return 1;
}

static int on_number(void *ctx, const char *s, size_t n)
{
    rec_parse *p = ctx;
    if (!value_ok(p, K_NUMBER))
        return 0;
    uint64_t v = 0;
    int shown = n < 24 ? (int)n : 24;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return field_error(p, p->field, "must be a whole number, 0 "
                               "or more, not %.*s", shown, s);
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10)
            return field_error(p, p->field, "%.*s is too large", shown, s);
        v = v * 10 + d;
    }
    p->num[p->field] = v;
    return 1;
}

static int on_bool(void *ctx, int v)
{
    rec_parse *p = ctx;
    p->flag = v;
    return value_ok(p, K_BOOL);
}

static int on_null(void *ctx)
{
    rec_parse *p = ctx;
    return value_ok(p, -1);
}

/* The record's own braces; any container inside it is refused. */
static int on_start_map(void *ctx)
{
    rec_parse *p = ctx;
    return p->depth++ == 0 || value_ok(p, -1);
}

static int on_end_map(void *ctx)
{
    rec_parse *p = ctx;
    p->depth--;
    return 1;
}

static int on_start_array(void *ctx)
{
    return value_ok(ctx, -1);
}

/* The fields every record has, the state's name, and the limits. */
static int check_fields(rec_parse *p, idem_record *r, size_t *keylen)
{
    static const int required[] = {F_STATE, F_TOKEN, F_CREATED, F_EXPIRES};
    int key = p->seen[F_KEY_B64] ? F_KEY_B64 : F_KEY;
    if (!p->seen[key])
        return field_error(p, F_KEY, "missing (or \"key_base64\")");
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (!p->seen[required[i]])
            return field_error(p, required[i], "missing");
    *keylen = p->len[key];
    if (*keylen == 0 || *keylen > IDEM_KEY_MAX)
        return field_error(p, key, "%zu bytes; keys are 1 to %u bytes",
                           *keylen, IDEM_KEY_MAX);
    const char *st = p->scratch->p + p->off[F_STATE];
    int i = 0;
    while (i < 3 && (strlen(states[i]) != p->len[F_STATE] ||
                     memcmp(states[i], st, p->len[F_STATE])))
        i++;
    if (i == 3)
        return field_error(p, F_STATE, "must be pending, done or failed");
    r->state = (idem_state)i;
    int resp = p->seen[F_RESP_B64] ? F_RESP_B64 : F_RESP;
    r->len = p->len[resp];
    if (r->len > IDEM_VALUE_MAX)
        return field_error(p, resp, "%zu bytes; the limit is %u", r->len,
                           IDEM_VALUE_MAX);
    return 1;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Times and token as a store can hold them: no record is created after
 * it expires, and none expires, or holds a lease, further from now than
 * the longest TTL. Only a pending record has a lease. */
static int check_numbers(rec_parse *p, idem_record *r)
{
    uint64_t limit = (uint64_t)(now_ms() + IDEM_MS_MAX);
    /* Room is left for 2^32 more claims of the key: a token at the
     * limit could not be followed by a greater one. */
    if (p->num[F_TOKEN] == 0 ||
        p->num[F_TOKEN] > IDEM_TOKEN_MAX - ((uint64_t)1 << 32))
        return field_error(p, F_TOKEN, "must be 1 to %" PRIu64 " (room "
                           "for later claims below IDEM_TOKEN_MAX)",
                           (uint64_t)(IDEM_TOKEN_MAX - ((uint64_t)1 << 32)));
    if (p->seen[F_ATTEMPTS] &&
        (p->num[F_ATTEMPTS] == 0 || p->num[F_ATTEMPTS] > UINT32_MAX))
        return field_error(p, F_ATTEMPTS, "must be 1 to %" PRIu32,
                           UINT32_MAX);
    if (p->num[F_EXPIRES] > limit)
        return field_error(p, F_EXPIRES, "%" PRIu64 " is further from now "
                           "than the longest TTL (100 years)",
                           p->num[F_EXPIRES]);
    if (p->num[F_CREATED] > p->num[F_EXPIRES])
        return field_error(p, F_CREATED, "%" PRIu64 " is after "
                           "\"expires_ms\" %" PRIu64, p->num[F_CREATED],
                           p->num[F_EXPIRES]);
    int pending = r->state == IDEM_STATE_PENDING;
    for (int f = F_LEASE; f <= F_RELEASED; f++)
        if (p->seen[f] && !pending)
            return field_error(p, f, "only a pending record has it");
    if (pending && !p->seen[F_LEASE])
        return field_error(p, F_LEASE, "missing (the record is pending)");
    if (pending && p->num[F_LEASE] > p->num[F_EXPIRES])
        return field_error(p, F_LEASE, "%" PRIu64 " is after "
                           "\"expires_ms\" %" PRIu64 ": a claimed record "
                           "lives at least as long as its lease",
                           p->num[F_LEASE], p->num[F_EXPIRES]);
    if (p->num[F_LEASE] > limit)
        return field_error(p, F_LEASE, "%" PRIu64 " is further from now "
                           "than the longest lease (100 years)",
                           p->num[F_LEASE]);
    r->token = p->num[F_TOKEN];
    r->attempts = p->seen[F_ATTEMPTS] ? (uint32_t)p->num[F_ATTEMPTS]
                  : r->token <= UINT32_MAX ? (uint32_t)r->token : 1;
    r->created_ms = (int64_t)p->num[F_CREATED];
    r->expires_ms = (int64_t)p->num[F_EXPIRES];
    r->lease_until = (int64_t)p->num[F_LEASE];
    r->released = p->flag;
    return 1;
}

/* YAJL's own message, on one line (not verbose: that one draws the
 * line and a caret under it), and the column it stopped at. */
static void syntax_error(rec_parse *p, yajl_handle h, size_t at)
{
    unsigned char *msg = yajl_get_error(h, 0, NULL, 0);
    p->col = at + 1;
    snprintf(p->err, p->errlen, "not a JSON object: %s",
             msg ? (char *)msg : "bad JSON");
    p->err[strcspn(p->err, "\n")] = '\0';
    if (msg)
        yajl_free_error(h, msg);
}

static int parse_line(rec_parse *p, const char *line, size_t len)
{
    static const yajl_callbacks cb = {
        on_null, on_bool, NULL, NULL, on_number, on_string, on_start_map,
        on_key, on_end_map, on_start_array, NULL};
    yajl_handle h = p->h = yajl_alloc(&cb, NULL, p);
    if (!h) {
        snprintf(p->err, p->errlen, "out of memory");
        return 0;
    }
    p->line = line;
    yajl_status st = yajl_parse(h, (const unsigned char *)line, len);
    /* Where the parse stopped; an error of yajl_complete_parse() is at
     * the end of the line (the object is not closed). */
    size_t at = st == yajl_status_ok ? len : yajl_get_bytes_consumed(h);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    if (st == yajl_status_error)
        syntax_error(p, h, at < len ? at : len);
    yajl_free(h);
    return st == yajl_status_ok;
}

/* A key in a key space is stored behind the space's prefix: copy the
 * prefix and the key to the end of scratch; *kf's offset and length
 * become the stored key's. */
static int space_in(rec_parse *p, int kf)
{
    char name[KS_NAME_MAX + 1];
    key_space ks;
    size_t n = p->len[F_SPACE];
    if (n > KS_NAME_MAX)
        return field_error(p, F_SPACE, "over %u bytes", KS_NAME_MAX);
    memcpy(name, p->scratch->p + p->off[F_SPACE], n);
    name[n] = '\0';
    if (memchr(name, '\0', n) || ks_set(&ks, name))
        return field_error(p, F_SPACE, "must be 1 to %u bytes of text, no "
                           "control characters", KS_NAME_MAX);
    if (p->len[kf] + ks.len > IDEM_KEY_MAX)
        return field_error(p, kf, "%zu bytes; keys in key space '%s' are 1 "
                           "to %zu bytes", p->len[kf], name,
                           IDEM_KEY_MAX - ks.len);
    cli_buf *b = p->scratch;
    size_t at = b->len;
    if (cli_buf_add(b, ks.prefix, ks.len) || cli_buf_reserve(b, p->len[kf]))
        return field_error(p, F_SPACE, "out of memory");
    memcpy(b->p + b->len, b->p + p->off[kf], p->len[kf]);
    b->len += p->len[kf];
    p->off[kf] = at;
    p->len[kf] += ks.len;
    return 1;
}

int rec_from_json(const char *line, size_t len, cli_buf *scratch,
                  const void **key, size_t *keylen, idem_record *r,
                  char *err, size_t errlen, size_t *col)
{
    rec_parse p = {.scratch = scratch, .field = -1, .err = err,
                   .errlen = errlen};
    memset(r, 0, sizeof *r);
    scratch->len = 0;
    int ok = parse_line(&p, line, len) && check_fields(&p, r, keylen) &&
             check_numbers(&p, r);
    *col = p.col;
    if (!ok)
        return -1;
    int kf = p.seen[F_KEY_B64] ? F_KEY_B64 : F_KEY;
    int rf = p.seen[F_RESP_B64] ? F_RESP_B64 : F_RESP;
    if (p.seen[F_SPACE] && !space_in(&p, kf))
        return -1;
    *keylen = p.len[kf];
    *key = scratch->p + p.off[kf];
    r->data = r->len ? scratch->p + p.off[rf] : NULL;
    if (p.seen[F_FP]) {
        memcpy(r->fp, scratch->p + p.off[F_FP], IDEM_FP_LEN);
        r->has_fp = 1;
    }
    return 0;
}
