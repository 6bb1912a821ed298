/* jsonkey.c - the key of a JSON line, found by a real JSON parser.
 *
 * Why a parser and not a pattern: a key name may appear inside a string
 * value ({"note": "\"event_id\": 7"}), be written with escapes
 * ("ev\u0065nt_id"), or sit at another depth than the one asked for; a
 * value may hold escapes that are part of the key. Only a parser gets all
 * of these right, and only a parser can say that a line is not JSON at
 * all, with the column where it broke.
 *
 * Why YAJL (Debian's libyajl-dev): it is a streaming (SAX) parser in C.
 * It validates the whole line, UTF-8 included, while calling us back for
 * each value, so finding the key costs no tree and no allocation per
 * value; on the benchmark corpus it parses about 330 MB/s on one core,
 * which leaves room for the store inside the 2x-mawk target. A DOM
 * parser (jansson, cJSON, json-c) builds every line as a tree only to
 * throw it away; simdjson is faster still but C++.
 *
 * The walk: `depth` counts the open containers; `on` how many of them
 * lie on the path (the outermost always does, so a value directly inside
 * container number `on` is on the path if its member name, or its index,
 * is the next segment). When such a value is at the path's full length it
 * is the key. Only the innermost on-path container's state matters, but
 * array indexes of outer ones must survive a nested value, so they live
 * on a small stack as deep as the path.
 *
 * A key is the exact bytes its JSON string denotes. YAJL decodes an
 * escape of half a UTF-16 surrogate pair that has no other half
 * ("\ud800" alone) to '?', a high half followed by another escape
 * ("\ud800\u0041") to the character the two would make were the second
 * a low half, and a low half alone to bytes that are not UTF-8: distinct
 * keys would become one. Such an escape denotes no character, so a key
 * (or a member name on the key's path) holding one makes the line bad
 * input; other strings of the line are not the key's business. */
#include "jsonkey.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

typedef struct jk_level {
    int is_array;
    size_t index;       /* arrays: the index of the next value */
    int member_on;      /* maps: the current member name is the segment */
} jk_level;

struct jk {
    const jk_path *path;
    jk_level *lv;       /* lv[d] for container depth d, 1..path->n */
    size_t depth, on;
    int found, not_scalar;
    char type[16];
    char *key;
    size_t keylen, keycap;
    char err[160];
    size_t column;
    int bad_escape;     /* the parse stopped at such an escape */
    const char *line;   /* the line being parsed, and its parser */
    yajl_handle h;
    yajl_callbacks cb;
};

/* Characters (not bytes) before byte `off`, plus one. */
static size_t column_of(const char *line, size_t off)
{
    size_t col = 1;
    for (size_t i = 0; i < off; i++)
        col += ((unsigned char)line[i] & 0xc0) != 0x80;
    return col;
}

/* The string YAJL just handed out must denote characters (see above);
 * `what` names it for the message. Returns 1, or 0 to stop the parse. */
static int exact_string(jk *x, const char *what)
{
    size_t bad = jk_bad_escape(x->line, yajl_get_bytes_consumed(x->h) - 1);
    if (!bad)
        return 1;
    snprintf(x->err, sizeof x->err, "%s '%s' holds \\%.5s, half of a "
             "UTF-16 surrogate pair: it denotes no character", what,
             x->path->spec, x->line + bad + 1);
    x->column = column_of(x->line, bad);
    x->bad_escape = 1;
    return 0;
}

/* Is the value starting now on the path, and is it the key itself? */
static int value_begins(jk *x, int *target)
{
    *target = 0;
    size_t d = x->depth;
    if (d == 0)
        return 1;  /* the top-level value: containers on it start the path */
    if (x->on != d || d > x->path->n)
        return 0;
    jk_level *l = &x->lv[d];
    int hit;
    if (l->is_array) {
        char num[24];
        int n = snprintf(num, sizeof num, "%zu", l->index++);
        hit = x->path->len[d - 1] == (size_t)n &&
              !memcmp(x->path->seg[d - 1], num, (size_t)n);
    } else {
        hit = l->member_on;
    }
    *target = hit && d == x->path->n;
    return hit;
}

static int set_key(jk *x, const char *s, size_t n, const char *type)
{
    if (!type) {
        if (n > x->keycap) {
            char *k = realloc(x->key, n);
            if (!k)
                return 0;
            x->key = k;
            x->keycap = n;
        }
        if (n)
            memcpy(x->key, s, n);
        x->keylen = n;
    } else {
        snprintf(x->type, sizeof x->type, "%s", type);
    }
    x->found = 1;
    x->not_scalar = type != NULL;
    return 1;
}

static int scalar(jk *x, const char *s, size_t n, const char *type)
{
    int target;
    value_begins(x, &target);
    return target ? set_key(x, s, n, type) : 1;
}

static int on_null(void *c)
{
    return scalar(c, NULL, 0, "null");
}

static int on_bool(void *c, int b)
{
    return scalar(c, NULL, 0, b ? "true" : "false");
}

static int on_number(void *c, const char *s, size_t n)
{
    return scalar(c, s, n, NULL);
}

static int on_string(void *c, const unsigned char *s, size_t n)
{
    jk *x = c;
    int target;
    value_begins(x, &target);
    if (!target)
        return 1;
    return exact_string(x, "the key field") &&
           set_key(x, (const char *)s, n, NULL);
}

static int open_container(void *c, int is_array)
{
    jk *x = c;
    int target, on = value_begins(x, &target);
    if (target)
        set_key(x, NULL, 0, is_array ? "an array" : "an object");
    x->depth++;
    if (on && !target && x->depth <= x->path->n) {
        x->on = x->depth;
        x->lv[x->depth] = (jk_level){is_array, 0, 0};
    }
    return 1;
}

static int on_start_map(void *c)
{
    return open_container(c, 0);
}

static int on_start_array(void *c)
{
    return open_container(c, 1);
}

static int on_end(void *c)
{
    jk *x = c;
    if (x->on == x->depth)
        x->on--;
    x->depth--;
    return 1;
}

static int on_map_key(void *c, const unsigned char *s, size_t n)
{
    jk *x = c;
    size_t d = x->depth;
    if (x->on != d || d > x->path->n)
        return 1;
    x->lv[d].member_on = x->path->len[d - 1] == n &&
                         !memcmp(x->path->seg[d - 1], s, n);
    return !x->lv[d].member_on ||
           exact_string(x, "a name on the key's path");
}

jk *jk_new(const jk_path *path)
{
    jk *x = calloc(1, sizeof *x);
    if (!x || !(x->lv = calloc(path->n + 1, sizeof *x->lv))) {
        free(x);
        return NULL;
    }
    x->path = path;
    x->cb = (yajl_callbacks){on_null, on_bool, NULL, NULL, on_number,
                             on_string, on_start_map, on_map_key, on_end,
                             on_start_array, on_end};
    return x;
}

void jk_free(jk *x)
{
    if (!x)
        return;
    free(x->lv);
    free(x->key);
    free(x);
}

/* at_end: the line ended inside a value (yajl_complete_parse failed). */
static void parse_error(jk *x, yajl_handle h, const char *line, size_t len,
                        int at_end)
{
    unsigned char *msg = yajl_get_error(h, 0, NULL, 0);
    size_t off = at_end ? len + 1 : yajl_get_bytes_consumed(h);
    snprintf(x->err, sizeof x->err, "%s", msg ? (char *)msg : "bad JSON");
    x->err[strcspn(x->err, "\n")] = '\0';
    if (msg)
        yajl_free_error(h, msg);
    /* yajl counts the byte it stopped at as consumed */
    x->column = off == 0 ? 1
                         : column_of(line, off - 1 < len ? off - 1 : len);
}

jk_result jk_extract(jk *x, const char *line, size_t len, const char **key,
                     size_t *keylen)
{
    x->depth = x->on = 0;
    x->found = x->not_scalar = x->bad_escape = 0;
    x->err[0] = '\0';
    yajl_handle h = x->h = yajl_alloc(&x->cb, NULL, x);
    x->line = line;
    if (!h) {
        snprintf(x->err, sizeof x->err, "out of memory");
        return JK_BAD_JSON;
    }
    yajl_status st = yajl_parse(h, (const unsigned char *)line, len);
    int at_end = st == yajl_status_ok;
    if (at_end)
        st = yajl_complete_parse(h);
    jk_result r = JK_OK;
    if (st == yajl_status_client_canceled) {
        if (!x->bad_escape)
            snprintf(x->err, sizeof x->err, "out of memory");
        r = JK_BAD_JSON;
    } else if (st != yajl_status_ok) {
        parse_error(x, h, line, len, at_end);
        r = JK_BAD_JSON;
    } else if (!x->found) {
        r = JK_MISSING;
    } else if (x->not_scalar) {
        snprintf(x->err, sizeof x->err, "%s", x->type);
        r = JK_NOT_SCALAR;
    }
    yajl_free(h);
    *key = x->key;
    *keylen = x->keylen;
    return r;
}

const char *jk_error(const jk *x)
{
    return x->err;
}

size_t jk_column(const jk *x)
{
    return x->column;
}

/* ------------------------------------------------------------------------
 * Escapes that denote no character */

/* Where the string that closes at line[end] opens: inside a string every
 * '"' is escaped, so it follows an odd run of backslashes; the opening
 * quote follows none. */
static size_t string_start(const char *line, size_t end)
{
    for (size_t q = end;;) {
        q = (size_t)((const char *)memrchr(line, '"', q) - line);
        size_t k = 0;
        while (k < q && line[q - 1 - k] == '\\')
            k++;
        if (k % 2 == 0)
            return q;
    }
}

/* The code unit of the \uXXXX escape at p (YAJL checked its digits). */
static unsigned unit_at(const char *p)
{
    char hex[5] = {p[2], p[3], p[4], p[5], 0};
    return (unsigned)strtoul(hex, NULL, 16);
}

static int is_low(unsigned u)
{
    return u >= 0xdc00 && u <= 0xdfff;
}

size_t jk_bad_escape(const char *line, size_t end)
{
    const char *s = line + string_start(line, end) + 1, *e = line + end;
    while ((s = memchr(s, '\\', (size_t)(e - s)))) {
        if (s[1] != 'u') {
            s += 2;
            continue;
        }
        unsigned u = unit_at(s);
        int high = u >= 0xd800 && u <= 0xdbff;
        if (is_low(u) || (high && (e - s < 12 || s[6] != '\\' ||
                                   s[7] != 'u' || !is_low(unit_at(s + 6)))))
            return (size_t)(s - line);
        s += high ? 12 : 6;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Paths */

static int add_seg(jk_path *p, const char *s, size_t n, int pointer)
{
    char *seg = malloc(n + 1);
    char **ss = realloc(p->seg, (p->n + 1) * sizeof *ss);
    if (ss)
        p->seg = ss;
    size_t *ls = realloc(p->len, (p->n + 1) * sizeof *ls);
    if (ls)
        p->len = ls;
    if (!seg || !ss || !ls) {
        free(seg);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (pointer && s[i] == '~' && i + 1 < n &&
            (s[i + 1] == '0' || s[i + 1] == '1'))
            seg[k++] = s[++i] == '0' ? '~' : '/';
        else
            seg[k++] = s[i];
    }
    p->seg[p->n] = seg;
    p->len[p->n++] = k;
    return 0;
}

int jk_path_parse(const char *spec, jk_path *p, char *err, size_t errlen)
{
    *p = (jk_path){.spec = spec};
    int pointer = spec[0] == '/';
    char sep = pointer ? '/' : '.';
    const char *s = spec + pointer;
    if (!*spec || (pointer && !*s)) {
        snprintf(err, errlen, "an empty key path names no field");
        return -1;
    }
    for (;;) {
        size_t n = strcspn(s, (char[]){sep, 0});
        if (n == 0 && !pointer) {
            snprintf(err, errlen,
                     "'%s' has an empty segment; write a.b.c, or a JSON "
                     "Pointer such as /a/b for names with dots",
                     spec);
            jk_path_free(p);
            return -1;
        }
        if (add_seg(p, s, n, pointer)) {
            snprintf(err, errlen, "out of memory");
            jk_path_free(p);
            return -1;
        }
        if (!s[n])
            return 0;
        s += n + 1;
    }
}

void jk_path_free(jk_path *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->seg[i]);
    free(p->seg);
    free(p->len);
    *p = (jk_path){0};
}
