/* deadletter.c - the --dead-letter file of `idem run`.
 *
 * A poison message (one that made the handler crash, hang or answer
 * outside the grammar --max-attempts times, stream.c) is appended here
 * as one JSON line:
 *
 *   {"key":"k1","key_space":"run","attempts":3,
 *    "error":"the handler exited with status 3 ...","message":{...}}
 *
 * ("key_base64" for a key that is not UTF-8; "message" is the input
 * line, or with --line a string, "message_base64" if not UTF-8). The
 * line is made durable before the store records the message's permanent
 * failure, so a crash between the two loses nothing: the rerun finds
 * the claim unfinished and the key in this file, and records the failure
 * from the file's line without running the handler or writing a second
 * line. That is why the keys of the file are loaded at the start: a key
 * is in the file at most once per key space (lines of other key spaces
 * are kept and ignored). The error is made valid UTF-8 ('?' for the bytes
 * of any other text) before it is written, so that the result recorded
 * from the file is byte for byte the one a run without the crash
 * records. A line cut short by a crash (no newline: the store recorded
 * nothing for it) is ended with a newline, skipped, and written again
 * whole when its message is set aside once more. */
#include "deadletter.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jsonkey.h"

struct dl_entry {
    size_t keylen, errlen;
    char bytes[];           /* the key, then the error */
};

static int cmp_key(const void *key, size_t keylen, const dl_entry *e)
{
    if (keylen != e->keylen)
        return keylen < e->keylen ? -1 : 1;
    return memcmp(key, e->bytes, keylen);
}

/* Where key is, or goes, in the sorted d->keys. */
static size_t find_slot(const dead_letters *d, const void *key,
                        size_t keylen, int *found)
{
    size_t lo = 0, hi = d->n;
    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_key(key, keylen, d->keys[mid]);
        if (!c) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static int remember(dead_letters *d, const void *key, size_t keylen,
                    const char *err, size_t errlen)
{
    int found;
    size_t at = find_slot(d, key, keylen, &found);
    if (found)
        return 0;
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 16;
        dl_entry **k = realloc(d->keys, cap * sizeof *k);
        if (!k)
            return -1;
        d->keys = k;
        d->cap = cap;
    }
    dl_entry *e = malloc(sizeof *e + keylen + errlen);
    if (!e)
        return -1;
    e->keylen = keylen;
    e->errlen = errlen;
    memcpy(e->bytes, key, keylen);
    memcpy(e->bytes + keylen, err, errlen);
    memmove(d->keys + at + 1, d->keys + at, (d->n - at) * sizeof *d->keys);
    d->keys[at] = e;
    d->n++;
    return 0;
}

const char *dl_find(const dead_letters *d, const void *key, size_t keylen,
                    size_t *len)
{
    int found;
    size_t at = d->path ? find_slot(d, key, keylen, &found) : 0;
    if (!d->path || !found)
        return NULL;
    *len = d->keys[at]->errlen;
    return d->keys[at]->bytes + keylen;
}

/* ------------------------------------------------------------------------
 * Loading the file */

enum { F_KEY, F_KEY_B64, F_SPACE, F_ERROR, F_COUNT };

typedef struct fields {
    jk_path path[F_COUNT];
    jk *jk[F_COUNT];
} fields;

static int fields_new(fields *f)
{
    static const char *const names[F_COUNT] = {"key", "key_base64",
                                               "key_space", "error"};
    char err[64];
    for (int i = 0; i < F_COUNT; i++)
        if (jk_path_parse(names[i], &f->path[i], err, sizeof err) ||
            !(f->jk[i] = jk_new(&f->path[i])))
            return -1;
    return 0;
}

static void fields_free(fields *f)
{
    for (int i = 0; i < F_COUNT; i++) {
        jk_free(f->jk[i]);
        jk_path_free(&f->path[i]);
    }
}

/* Remember the key of one line if it is of d->ks; a line that is not
 * one of ours is skipped. 0, or -1 when out of memory. */
static int load_line(dead_letters *d, fields *f, const char *line,
                     size_t len)
{
    const char *v;
    size_t n;
    jk_result space = jk_extract(f->jk[F_SPACE], line, len, &v, &n);
    if (space == JK_BAD_JSON || (space == JK_OK) != !!d->ks->name ||
        (space == JK_OK && !ks_is(d->ks, v, n)) ||
        jk_extract(f->jk[F_ERROR], line, len, &v, &n) != JK_OK)
        return 0;
    char *err = malloc(n + 1);
    if (!err)
        return -1;
    memcpy(err, v, n);
    size_t errlen = n;
    int rc = 0;
    if (jk_extract(f->jk[F_KEY], line, len, &v, &n) == JK_OK) {
        rc = remember(d, v, n, err, errlen);
    } else if (jk_extract(f->jk[F_KEY_B64], line, len, &v, &n) == JK_OK) {
        unsigned char *key = malloc(n / 4 * 3 + 3);
        long k = key ? cli_base64_decode(v, n, key) : -1;
        rc = !key ? -1 : k < 0 ? 0 : remember(d, key, (size_t)k, err,
                                              errlen);
        free(key);
    }
    free(err);
    return rc;
}

static int load(dead_letters *d, const char *cmd)
{
    int fd = dup(d->fd);
    FILE *in = fd < 0 ? NULL : fdopen(fd, "r");
    fields f = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len = 0;
    int rc = !in || fields_new(&f);
    int last = '\n';
    while (!rc && (len = getline(&line, &cap, in)) > 0) {
        last = line[len - 1];
        rc = load_line(d, &f, line, (size_t)len - (last == '\n'));
    }
    rc = rc || ferror(in);
    fields_free(&f);
    free(line);
    if (in)
        fclose(in);
    else if (fd >= 0)
        close(fd);
    if (!rc && last != '\n' && write(d->fd, "\n", 1) != 1)
        rc = 1;
    return rc ? cli_fail(cmd, "--dead-letter %s: reading it failed: %s",
                         d->path, errno ? strerror(errno) : "out of memory")
              : 0;
}

/* A file created now survives a crash only with its directory entry. */
static int sync_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1
                 : (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd < 0 || fsync(fd);
    if (fd >= 0)
        close(fd);
    return rc;
}

int dl_open(dead_letters *d, const char *cmd, const key_space *ks)
{
    d->ks = ks;
    if (!d->path)
        return 0;
    d->fd = open(d->path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (d->fd < 0 || sync_dir_of(d->path))
        return cli_fail(cmd, "--dead-letter %s: %s", d->path,
                        strerror(errno));
    errno = 0;
    return load(d, cmd);
}

/* ------------------------------------------------------------------------
 * Adding a line */

/* err as valid UTF-8: unchanged if it is, else with '?' for each byte
 * over 0x7f. Into b. */
static int valid_text(cli_buf *b, const char *err)
{
    size_t n = strlen(err);
    b->len = 0;
    if (cli_buf_add(b, err, n))
        return -1;
    for (size_t i = 0; !cli_utf8_valid(b->p, n) && i < n; i++)
        if ((unsigned char)b->p[i] > 0x7f)
            b->p[i] = '?';
    return 0;
}

/* The test suite's hook for a kill -9 between the line and the store:
 * IDEM_TEST_KILL_AT=dead-letter (docs/testing.md: for the tests only). */
static void test_kill_point(void)
{
    const char *at = getenv("IDEM_TEST_KILL_AT");
    if (at && !strcmp(at, "dead-letter"))
        raise(SIGKILL);
}

static int write_line(dead_letters *d, const void *key, size_t keylen,
                      const void *msg, size_t msglen, uint32_t attempts,
                      const cli_buf *err)
{
    cli_buf *b = &d->line;
    b->len = 0;
    int rc = cli_buf_str(b, "{") ||
             cli_buf_bytes_member(b, "key", "key_base64", key, keylen) ||
             cli_buf_str(b, ",\"key_space\":");
    rc = rc ? rc : d->ks->name ? cli_buf_json_string(b, d->ks->name,
                                                 strlen(d->ks->name))
                               : cli_buf_str(b, "null");
    rc = rc ? rc : cli_buf_fmt(b, ",\"attempts\":%u,\"error\":", attempts) ||
                   cli_buf_json_string(b, err->p, err->len) ||
                   cli_buf_str(b, ",");
    rc = rc ? rc : d->line_mode
                       ? cli_buf_bytes_member(b, "message", "message_base64",
                                          msg, msglen)
                       : cli_buf_str(b, "\"message\":") ||
                             cli_buf_add(b, msg, msglen);
    return rc ? rc : cli_buf_str(b, "}\n");
}

int dl_add(dead_letters *d, const char *cmd, const void *key, size_t keylen,
           const void *msg, size_t msglen, uint32_t attempts,
           const char *err)
{
    cli_buf text = {0};
    int rc = valid_text(&text, err) ||
             write_line(d, key, keylen, msg, msglen, attempts, &text);
    if (rc) {
        cli_buf_free(&text);
        return cli_fail(cmd, "out of memory");
    }
    ssize_t w = write(d->fd, d->line.p, d->line.len);
    if (w != (ssize_t)d->line.len || fdatasync(d->fd)) {
        cli_buf_free(&text);
        return cli_fail(cmd, "--dead-letter %s: writing failed: %s",
                        d->path, w < 0 || w == (ssize_t)d->line.len
                                     ? strerror(errno) : "a short write");
    }
    test_kill_point();
    rc = remember(d, key, keylen, text.p, text.len);
    cli_buf_free(&text);
    return rc ? cli_fail(cmd, "out of memory") : 0;
}

void dl_close(dead_letters *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->keys[i]);
    free(d->keys);
    cli_buf_free(&d->line);
    if (d->path && d->fd >= 0)
        close(d->fd);
}
