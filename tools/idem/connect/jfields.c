/* jfields.c - a JSON line's top-level members (jfields.h), with YAJL's
 * event parser: a scalar at depth 1 is a value as it comes, a nested
 * object or array its text from where it opened to where it closed. */
#include "jfields.h"

#include <stdlib.h>
#include <string.h>


int jf_push(jfields *k, const void *p, size_t n)
{
    if (k->nf == k->capf) {
        size_t cap = k->capf ? 2 * k->capf : 64;
        size_t *o = realloc(k->off, cap * sizeof *o);
        if (o)
            k->off = o;
        size_t *l = o ? realloc(k->len, cap * sizeof *l) : NULL;
        if (!l)
            return -1;
        k->len = l;
        k->capf = cap;
    }
    k->off[k->nf] = k->buf.len;
    k->len[k->nf++] = n;
    return cli_buf_add(&k->buf, p, n);
}

/* A scalar or a whole nested value at depth 1 is a field's value. */
static int on_scalar(void *ctx, const char *p, size_t n)
{
    jfields *k = ctx;
    return k->depth != 1 || jf_push(k, p, n) == 0;
}

static int on_string(void *ctx, const unsigned char *p, size_t n)
{
    return on_scalar(ctx, (const char *)p, n);
}

static int on_number(void *ctx, const char *p, size_t n)
{
    return on_scalar(ctx, p, n);
}

static int on_bool(void *ctx, int b)
{
    return on_scalar(ctx, b ? "true" : "false", b ? 4 : 5);
}

static int on_null(void *ctx)
{
    return on_scalar(ctx, "null", 4);
}

static int on_key(void *ctx, const unsigned char *p, size_t n)
{
    jfields *k = ctx;
    return k->depth != 1 || jf_push(k, p, n) == 0;
}

static int on_open(void *ctx)
{
    jfields *k = ctx;
    if (k->depth++ == 1)
        k->vstart = yajl_get_bytes_consumed(k->y) - 1;
    return 1;
}

static int on_close(void *ctx)
{
    jfields *k = ctx;
    if (--k->depth == 1)
        return jf_push(k, k->text + k->vstart,
                       yajl_get_bytes_consumed(k->y) - k->vstart) == 0;
    return 1;
}

static const yajl_callbacks fields_cb = {
    on_null, on_bool, NULL, NULL, on_number, on_string,
    on_open, on_key, on_close, on_open, on_close};

int jf_parse(jfields *k, const char *text, size_t len)
{
    k->buf.len = k->nf = 0;
    k->depth = 0;
    k->text = text;
    if (k->y)
        yajl_free(k->y);
    k->y = yajl_alloc(&fields_cb, NULL, k);
    if (!k->y)
        return -1;
    size_t lead = strspn(text, " \t");
    int object = lead < len && text[lead] == '{' &&
                 yajl_parse(k->y, (const unsigned char *)text, len) ==
                     yajl_status_ok &&
                 yajl_complete_parse(k->y) == yajl_status_ok;
    if (!object)
        k->buf.len = k->nf = 0;
    return object;
}

long jf_find(const jfields *f, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i + 1 < f->nf; i += 2)
        if (f->len[i] == n && !memcmp(f->buf.p + f->off[i], name, n))
            return (long)i + 1;
    return -1;
}

void jf_free(jfields *f)
{
    cli_buf_free(&f->buf);
    free(f->off);
    free(f->len);
    if (f->y)
        yajl_free(f->y);
    memset(f, 0, sizeof *f);
}
