/* ndjson.h - lines from a list of inputs, in batches. */
#ifndef IDEM_NDJSON_H
#define IDEM_NDJSON_H

#include <stddef.h>
#include <stdint.h>

typedef struct nd_line {
    const char *p;      /* the line without its "\n" (a "\r" stays) */
    size_t len;
    int has_nl;         /* 0 for a last line without a newline */
    uint64_t lineno;    /* 1-based, in its input */
    uint64_t end;       /* input offset just past the line */
    int again;          /* a stream entry handed out before (its
                         * consumer's pending list, or taken over from
                         * another consumer): its output may be in the
                         * sink already, from a run that did not commit
                         * it. 0 for a file's line */
    uint64_t since;     /* again: no run can have written its output
                         * before this time (ms, the source server's
                         * clock): its first delivery, else its entry's
                         * own time. 0: not known */
    const char *meta;   /* the message's key and headers beside the line
                         * (connect.h, META_*); NULL for none */
    size_t metalen;
} nd_line;

typedef struct nd_reader {
    char **paths;       /* "-" is standard input */
    size_t npaths, cur;
    int fd;
    char *buf;
    size_t cap, start, pos, end; /* held [start, pos), unread [pos, end) */
    uint64_t base;      /* input offset of buf[0] */
    uint64_t lineno;
    int eof;            /* the current input has no more bytes */
    int leave_partial;  /* set by the caller: leave an unterminated last
                         * line of the last input unread */
    uint64_t partial_len; /* ... and then its length, and line number */
    uint64_t partial_lineno;
    char err[300];
} nd_reader;

enum {
    ND_LINE = 1,  /* *l is the next line */
    ND_FULL,      /* the buffer is full of held lines: release them */
    ND_IDLE,      /* no line ready without waiting (pipes) */
    ND_NEXT,      /* the current input ended; the next call opens the
                   * next one */
    ND_END,       /* all inputs ended */
    ND_AGAIN,     /* the lines handed out since the last release are
                   * taken back (a broker gave their partitions to
                   * another reader): drop them, they come again */
    ND_ERR = -1   /* err says why */
};

/* Start reading paths[0..n) (none: standard input) from input `at`, byte
 * offset `off`, whose line number there is `lineno`. */
int nd_open(nd_reader *r, char **paths, size_t n, size_t at, uint64_t off,
            uint64_t lineno);
void nd_close(nd_reader *r);

/* The next line. Lines stay valid until nd_release(). When `wait` is 0
 * and some lines are held, a pipe with nothing to read gives ND_IDLE
 * instead of blocking, so a slow stream still commits promptly. */
int nd_next(nd_reader *r, nd_line *l, int wait);

/* Drop the lines returned so far; their memory may be reused. */
void nd_release(nd_reader *r);

/* Name of the current input ("-" shows as "<stdin>"). */
const char *nd_name(const nd_reader *r);

#endif
