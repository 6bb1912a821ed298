/* connect.c - which source or sink a URI names, and files as a source.
 *
 * The dispatch is by scheme, one line per broker. Files come through the
 * same table as the streams so that the loop in stream.c has one way to
 * read; only their opening differs, since where a file is resumed comes
 * from the job's checkpoint (job.c). */
#include "connect.h"

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kafka.h"
#include "nstream.h"
#include "rstream.h"

int connect_is_uri(const char *uri)
{
    return rs_is_uri(uri) || kafka_is_uri(uri) || ns_is_uri(uri);
}

int connect_kind(const char *uri)
{
    return rs_is_uri(uri)      ? 'r'
           : kafka_is_uri(uri) ? 'k'
           : ns_is_uri(uri)    ? 'n'
                               : 0;
}

int connect_ident(const char *cmd, const char *uri, int as_sink, char *buf,
                  size_t size)
{
    if (rs_is_uri(uri))
        return rs_ident(cmd, uri, as_sink, buf, size);
    if (kafka_is_uri(uri))
        return kafka_ident(cmd, uri, as_sink, buf, size);
    if (ns_is_uri(uri))
        return ns_ident(cmd, uri, as_sink, buf, size);
    return cli_usage_error(cmd, "%s: not a stream URI", uri);
}

source *source_open(const char *cmd, const char *uri, const source_opts *o,
                    int *status)
{
    if (rs_is_uri(uri))
        return rs_source_open(cmd, uri, o, status);
    if (kafka_is_uri(uri))
        return kafka_source_open(cmd, uri, o, status);
    if (ns_is_uri(uri))
        return ns_source_open(cmd, uri, o, status);
    *status = cli_usage_error(cmd, "%s: not a stream URI", uri);
    return NULL;
}

sink *sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                int *status)
{
    if (rs_is_uri(uri))
        return rs_sink_open(cmd, uri, lease_ms, status);
    if (kafka_is_uri(uri))
        return kafka_sink_open(cmd, uri, lease_ms, status);
    if (ns_is_uri(uri))
        return ns_sink_open(cmd, uri, lease_ms, status);
    *status = cli_usage_error(cmd, "%s: not a stream URI", uri);
    return NULL;
}

/* ---- a message's meta */

static int add_part(cli_buf *b, const void *p, size_t n, int none)
{
    uint32_t v = none ? META_NULL : (uint32_t)n;
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                           (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    return cli_buf_add(b, le, 4) || (!none && cli_buf_add(b, p, n)) ? -1
                                                                    : 0;
}

int meta_add(cli_buf *b, int type, const char *name, size_t namelen,
             const void *value, size_t valuelen)
{
    unsigned char t = (unsigned char)type;
    /* Room for all of it at once: a source adds a record per field. */
    if (namelen >= META_NULL || valuelen >= META_NULL ||
        cli_buf_reserve(b, 9 + namelen + valuelen) ||
        cli_buf_add(b, &t, 1) ||
        (type != META_KEY && add_part(b, name, namelen, 0)))
        return -1;
    return add_part(b, value, valuelen, value == NULL);
}

/* One part at *at: 1, or 0 when it runs past the end. */
static int take_part(const char *meta, size_t len, size_t *at,
                     const char **p, size_t *n)
{
    if (len - *at < 4)
        return 0;
    const unsigned char *u = (const unsigned char *)meta + *at;
    uint32_t v = (uint32_t)u[0] | (uint32_t)u[1] << 8 |
                 (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    *at += 4;
    if (v == META_NULL) {
        *p = NULL;
        *n = 0;
        return 1;
    }
    if (len - *at < v)
        return 0;
    *p = meta + *at;
    *n = v;
    *at += v;
    return 1;
}

/* The record at *at, of any type. */
static int take_rec(const char *meta, size_t len, size_t *at, meta_rec *r)
{
    if (!meta || *at >= len)
        return 0;
    *r = (meta_rec){.type = (unsigned char)meta[(*at)++]};
    int named = r->type == META_HEADER || r->type == META_FIELD;
    if (named &&
        (!take_part(meta, len, at, &r->name, &r->namelen) || !r->name))
        return 0;
    return (named || r->type == META_KEY) &&
           take_part(meta, len, at, &r->value, &r->valuelen);
}

/* The next record of type `field` (1) or of another type (0). */
static int next_of(const char *meta, size_t len, size_t *at, meta_rec *r,
                   int field)
{
    while (take_rec(meta, len, at, r))
        if ((r->type == META_FIELD) == field)
            return 1;
    return 0;
}

int meta_next(const char *meta, size_t len, size_t *at, meta_rec *r)
{
    return next_of(meta, len, at, r, 0);
}

int meta_field_next(const char *meta, size_t len, size_t *at, meta_rec *r)
{
    return next_of(meta, len, at, r, 1);
}

int meta_has_fields(const char *meta, size_t len)
{
    return meta && len && meta[0] == META_FIELD;
}

int meta_key_spec(const char *spec)
{
    return spec && (!strcmp(spec, "@key") || !strncmp(spec, "header:", 7));
}

int meta_key(const char *meta, size_t len, const char *spec,
             const char **key, size_t *klen)
{
    int want = strcmp(spec, "@key") ? META_HEADER : META_KEY;
    const char *name = spec + 7;
    size_t at = 0;
    meta_rec r;
    while (meta_next(meta, len, &at, &r))
        if (r.type == want && r.value &&
            (want == META_KEY || (r.namelen == strlen(name) &&
                                  !memcmp(r.name, name, r.namelen)))) {
            *key = r.value;
            *klen = r.valuelen;
            return 1;
        }
    return 0;
}

/* ---- files */

typedef struct files {
    source base;
    nd_reader *rd;
    volatile const sig_atomic_t *stop;
} files;

static int files_next(source *s, nd_line *l, int wait)
{
    return nd_next(((files *)s)->rd, l, wait);
}

static void files_release(source *s)
{
    nd_release(((files *)s)->rd);
}

/* A pipe with no whole line buffered: wait until it has bytes or a stop
 * is asked for, since the reader's read(2) goes on after the signal. */
static int files_wait(source *s)
{
    files *f = (files *)s;
    const nd_reader *rd = f->rd;
    if (rd->fd < 0 || rd->eof || rd->cur >= rd->npaths ||
        (rd->pos < rd->end &&
         memchr(rd->buf + rd->pos, '\n', rd->end - rd->pos)))
        return *f->stop != 0;
    struct pollfd p = {rd->fd, POLLIN, 0};
    while (!*f->stop && poll(&p, 1, 100) == 0)
        ;
    return *f->stop != 0;
}

static const char *files_err(const source *s)
{
    return ((const files *)s)->rd->err;
}

static void files_where(const source *s, const nd_line *l, char *buf,
                        size_t n)
{
    snprintf(buf, n, "%s:%" PRIu64, nd_name(((const files *)s)->rd),
             l->lineno);
}

static void files_close(source *s)
{
    free(s);
}

static const source_ops files_ops = {
    .next = files_next, .release = files_release, .wait = files_wait,
    .err = files_err, .where = files_where, .close = files_close};

source *source_files(nd_reader *rd, const source_opts *o)
{
    files *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->base.ops = &files_ops;
    f->rd = rd;
    f->stop = o->stop;
    return &f->base;
}

int connect_outcome(const char *st, size_t stlen, const char *res,
                    size_t reslen, const char **status, const char **result,
                    size_t *rlen)
{
    static const char *const known[] = {"done", "failed", "gave_up"};
    *status = NULL;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (stlen == strlen(known[i]) && !memcmp(st, known[i], stlen))
            *status = known[i];
    *result = *status && reslen ? res : NULL;
    *rlen = *status ? reslen : 0;
    return 1;
}
