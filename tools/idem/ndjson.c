/* ndjson.c - reading NDJSON inputs line by line, in batches.
 *
 * The lines of one batch must stay in memory until the batch commits:
 * they are written to the output only then. So the reader hands out
 * pointers into its buffer and never moves what it handed out until the
 * caller releases it; when the buffer is full of held lines it says so
 * (ND_FULL) and the caller ends the batch. A line longer than the buffer
 * grows it once nothing is held. read(2) into one buffer, not mmap, so
 * resident memory stays the size of a batch whatever the input size.
 *
 * A batch never spans two inputs (ND_NEXT between them), so a position
 * is always (input number, byte offset), which is what a checkpoint
 * needs to resume.
 *
 * A line is complete once its newline is there. At the end of the last
 * input, bytes without one may be a line that a writer is still adding
 * to; with `leave_partial` set they are left unread (partial_len says
 * how many), so that no position ever falls inside a line: handing out
 * "a2" of a file that later reads "a2x\n" would make a rerun see "x" as
 * a line of its own. The last line of an input that another input
 * follows ends with its file: nothing can be glued to it. */
#include "ndjson.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ND_MIN_BUF (4u << 20)
#define ND_MAX_LINE (1ull << 31)

static char dash[] = "-";
static char *stdin_only[] = {dash};

static int open_input(nd_reader *r, uint64_t off)
{
    const char *p = r->paths[r->cur];
    r->fd = strcmp(p, "-") ? open(p, O_RDONLY | O_CLOEXEC) : 0;
    if (r->fd < 0) {
        snprintf(r->err, sizeof r->err, "%s: %s", p, strerror(errno));
        return ND_ERR;
    }
    r->start = r->pos = r->end = 0;
    r->base = off;
    r->eof = 0;
    if (off && lseek(r->fd, (off_t)off, SEEK_SET) < 0) {
        snprintf(r->err, sizeof r->err, "%s: cannot seek to %llu: %s", p,
                 (unsigned long long)off, strerror(errno));
        return ND_ERR;
    }
    return 0;
}

int nd_open(nd_reader *r, char **paths, size_t n, size_t at, uint64_t off,
            uint64_t lineno)
{
    memset(r, 0, sizeof *r);
    r->paths = n ? paths : stdin_only;
    r->npaths = n ? n : 1;
    r->cur = at;
    r->lineno = lineno;
    r->fd = -1;
    r->cap = ND_MIN_BUF;
    r->buf = malloc(r->cap);
    if (!r->buf) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return ND_ERR;
    }
    return at < r->npaths ? open_input(r, off) : 0;
}

void nd_close(nd_reader *r)
{
    if (r->fd > 0)
        close(r->fd);
    r->fd = -1;
    free(r->buf);
    r->buf = NULL;
}

const char *nd_name(const nd_reader *r)
{
    const char *p = r->paths[r->cur < r->npaths ? r->cur : r->npaths - 1];
    return strcmp(p, "-") ? p : "<stdin>";
}

void nd_release(nd_reader *r)
{
    r->start = r->pos;
}

/* Make room to read more: move unheld bytes to the front, or grow. */
static int make_room(nd_reader *r)
{
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->base += r->start;
        r->pos -= r->start;
        r->end -= r->start;
        r->start = 0;
        return 0;
    }
    if (r->cap >= ND_MAX_LINE) {
        snprintf(r->err, sizeof r->err, "%s: line %llu is over 2 GiB",
                 nd_name(r), (unsigned long long)r->lineno + 1);
        return ND_ERR;
    }
    char *b = realloc(r->buf, r->cap * 2);
    if (!b) {
        snprintf(r->err, sizeof r->err, "out of memory for a line of %zu "
                 "bytes", r->end - r->pos);
        return ND_ERR;
    }
    r->buf = b;
    r->cap *= 2;
    return 0;
}

static int would_block(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 0;
}

/* Read more bytes of the current input. */
static int fill(nd_reader *r, int wait)
{
    if (r->end == r->cap) {
        if (r->start < r->pos)
            return ND_FULL;
        int rc = make_room(r);
        if (rc)
            return rc;
    }
    if (!wait && r->start < r->pos && would_block(r->fd))
        return ND_IDLE;
    ssize_t n;
    do
        n = read(r->fd, r->buf + r->end, r->cap - r->end);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        snprintf(r->err, sizeof r->err, "%s: %s", nd_name(r),
                 strerror(errno));
        return ND_ERR;
    }
    r->end += (size_t)n;
    r->eof = n == 0;
    return 0;
}

static void take(nd_reader *r, nd_line *l, size_t len, int nl)
{
    l->p = r->buf + r->pos;
    l->len = len;
    l->has_nl = nl;
    l->again = 0;
    l->since = 0;
    l->meta = NULL;
    l->metalen = 0;
    l->lineno = ++r->lineno;
    r->pos += len + (size_t)nl;
    l->end = r->base + r->pos;
}

/* At the end of the last input: are the bytes without a newline left
 * unread? */
static int leaves_partial(nd_reader *r)
{
    if (!r->leave_partial || r->cur + 1 < r->npaths)
        return 0;
    r->partial_len = r->end - r->pos;
    r->partial_lineno = r->lineno + 1;
    return 1;
}

/* The current input is done: close it; the next call opens the next. */
static int next_input(nd_reader *r)
{
    if (r->start < r->pos)
        return ND_NEXT;  /* release the held lines first */
    if (r->fd > 0)
        close(r->fd);
    r->fd = -1;
    r->lineno = 0;
    if (++r->cur >= r->npaths)
        return ND_END;
    int rc = open_input(r, 0);
    return rc ? rc : ND_NEXT;
}

int nd_next(nd_reader *r, nd_line *l, int wait)
{
    if (r->cur >= r->npaths)
        return ND_END;
    if (r->fd < 0)
        return next_input(r);
    for (;;) {
        char *nl = memchr(r->buf + r->pos, '\n', r->end - r->pos);
        if (nl) {
            take(r, l, (size_t)(nl - (r->buf + r->pos)), 1);
            return ND_LINE;
        }
        if (r->eof && r->pos < r->end && !leaves_partial(r)) {
            take(r, l, r->end - r->pos, 0);
            return ND_LINE;
        }
        if (r->eof)
            return next_input(r);
        int rc = fill(r, wait);
        if (rc)
            return rc;
    }
}
