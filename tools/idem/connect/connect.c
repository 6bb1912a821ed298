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
#include "nstream.h"
#include "rstream.h"

int connect_is_uri(const char *uri)
{
    return rs_is_uri(uri) || ns_is_uri(uri);
}

int connect_ident(const char *cmd, const char *uri, int as_sink, char *buf,
                  size_t size)
{
    if (rs_is_uri(uri))
        return rs_ident(cmd, uri, as_sink, buf, size);
    if (ns_is_uri(uri))
        return ns_ident(cmd, uri, as_sink, buf, size);
    return cli_usage_error(cmd, "%s: not a stream URI", uri);
}

source *source_open(const char *cmd, const char *uri, const source_opts *o,
                    int *status)
{
    if (rs_is_uri(uri))
        return rs_source_open(cmd, uri, o, status);
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
    if (ns_is_uri(uri))
        return ns_sink_open(cmd, uri, lease_ms, status);
    *status = cli_usage_error(cmd, "%s: not a stream URI", uri);
    return NULL;
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

int connect_header(const char *hdr, size_t hdrlen, const char *name,
                   size_t n, const char **v, size_t *vlen)
{
    const char *p = hdr, *end = hdr ? hdr + hdrlen : NULL;
    while (p && p < end) {
        const char *nul = memchr(p, 0, (size_t)(end - p));
        const char *val = nul ? nul + 1 : end;
        const char *vend = val < end ? memchr(val, 0, (size_t)(end - val))
                                     : NULL;
        if (!vend)
            return 0;
        if ((size_t)(nul - p) == n && !memcmp(p, name, n)) {
            *v = val;
            *vlen = (size_t)(vend - val);
            return 1;
        }
        p = vend + 1;
    }
    return 0;
}
