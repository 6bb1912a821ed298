/* jsonout.c - JSON text out of arbitrary bytes.
 *
 * Keys and responses are bytes; JSON strings are Unicode. Valid UTF-8
 * goes out as a JSON string with the escapes RFC 8259 requires; anything
 * else goes out as base64 in a field whose name says so (dump writes
 * "key_base64" for such a key), so an export never loses or changes a
 * byte and `idem load` gets back exactly what was stored.
 *
 * A value that should be JSON (a handler's answer, cached as a result)
 * goes out as written only when it is one JSON value on one line: the
 * store holds whatever its writer gave (a library program may cache "ok"
 * or raw bytes; an answer too large to store leaves a sentence), and an
 * output line must stay one valid JSON value. Anything else goes out as
 * text or base64 under a name that says so, never guessed into JSON. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

#include "cli.h"

int cli_buf_reserve(cli_buf *b, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return -1;
        b->p = q;
        b->cap = cap;
    }
    return 0;
}

int cli_buf_str(cli_buf *b, const char *s)
{
    return cli_buf_add(b, s, strlen(s));
}

int cli_buf_fmt(cli_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return -1;
    return cli_buf_add(b, tmp, (size_t)n);
}

void cli_buf_free(cli_buf *b)
{
    free(b->p);
    *b = (cli_buf){0};
}

/* Length of the UTF-8 sequence at s (n bytes left), or 0 if invalid:
 * overlong forms, surrogates and code points past U+10FFFF included. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3
                            : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n)
        return 0;
    unsigned cp = len == 1 ? c : c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

int cli_utf8_valid(const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n;) {
        size_t k = s[i] < 0x80 ? 1 : utf8_seq(s + i, n - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

int cli_buf_json_string(cli_buf *b, const void *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = p;
    int rc = cli_buf_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        rc = cli_buf_add(b, s + run, i - run);
        char esc[6] = {'\\', (char)c, 0};
        size_t k = 2;
        if (c == '\n' || c == '\t' || c == '\r') {
            esc[1] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else if (c < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            k = 6;
        }
        if (!rc)
            rc = cli_buf_add(b, esc, k);
        run = i + 1;
    }
    if (!rc)
        rc = cli_buf_add(b, s + run, n - run);
    return rc ? rc : cli_buf_add(b, "\"", 1);
}

int cli_buf_bytes_member(cli_buf *b, const char *text_name,
                         const char *b64_name, const void *p, size_t n)
{
    int text = cli_utf8_valid(p, n);
    int rc = cli_buf_fmt(b, "\"%s\":", text ? text_name : b64_name);
    if (rc)
        return rc;
    return text ? cli_buf_json_string(b, p, n) : cli_buf_base64(b, p, n);
}

int cli_json_one_line(const void *p, size_t n)
{
    if (!n || memchr(p, '\n', n))
        return 0;  /* a line break is JSON's whitespace, NDJSON's end */
    yajl_handle h = yajl_alloc(NULL, NULL, NULL);
    if (!h)
        return -1;
    int ok = yajl_parse(h, p, n) == yajl_status_ok &&
             yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    return ok;
}

int cli_buf_json_member(cli_buf *b, const char *name, const void *p, size_t n)
{
    int json = cli_json_one_line(p, n);
    if (json < 0)
        return -1;
    if (json)
        return cli_buf_fmt(b, "\"%s\":", name) || cli_buf_add(b, p, n);
    char text[64], bytes[64];
    snprintf(text, sizeof text, "%s_text", name);
    snprintf(bytes, sizeof bytes, "%s_base64", name);
    return cli_buf_bytes_member(b, text, bytes, p, n);
}

static const char b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int cli_buf_base64(cli_buf *b, const void *p, size_t n)
{
    const unsigned char *s = p;
    int rc = cli_buf_add(b, "\"", 1);
    for (size_t i = 0; !rc && i < n; i += 3) {
        unsigned v = (unsigned)s[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)s[i + 1] << 8;
        if (i + 2 < n)
            v |= s[i + 2];
        char q[4] = {b64[v >> 18], b64[(v >> 12) & 63],
                     i + 1 < n ? b64[(v >> 6) & 63] : '=',
                     i + 2 < n ? b64[v & 63] : '='};
        rc = cli_buf_add(b, q, 4);
    }
    return rc ? rc : cli_buf_add(b, "\"", 1);
}

long cli_base64_decode(const char *s, size_t n, unsigned char *out)
{
    if (n % 4)
        return -1;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        unsigned v = 0;
        int pad = 0;
        for (size_t j = 0; j < 4; j++) {
            const char *c = s[i + j] ? strchr(b64, s[i + j]) : NULL;
            if (s[i + j] == '=' && i + 4 == n && j >= 2)
                pad++;
            else if (!c || pad)
                return -1;
            v = (v << 6) | (c ? (unsigned)(c - b64) : 0);
        }
        out[len++] = (unsigned char)(v >> 16);
        if (pad < 2)
            out[len++] = (unsigned char)(v >> 8);
        if (pad < 1)
            out[len++] = (unsigned char)v;
    }
    return len;
}
